// Internal to //runtime/comm:nccl_driver (device builds only): the CUDA pieces the NCCL driver
// shares between its files. Thread-safe.
#ifndef EMBER_RUNTIME_COMM_NCCL_INTERNAL_H_
#define EMBER_RUNTIME_COMM_NCCL_INTERNAL_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/comm/work.h"

namespace ember::comm::nccl_internal {

// Minimum compute capability (sm_75: Turing) the device backends support.
constexpr int kMinSm = 75;

// "cuda:N" -> N, after checking the CUDA driver against the runtime this binary was built with and
// device N's compute capability; FAILED_PRECONDITION naming the versions found and the minimum.
absl::StatusOr<int> CheckCudaDevice(const std::string& device);

// "cudaErrorX (message) in <what>" as an INTERNAL status, or OK.
absl::Status CudaStatus(cudaError_t e, const char* what);

// The start/end events of one op on `stream`, with device times anchored at a reference event
// recorded (with its host time) when the communicator was created.
class CudaEvents : public DeviceEvents {
 public:
  // Records the start event on `stream` now; call RecordEnd after enqueueing the op.
  static absl::StatusOr<std::shared_ptr<CudaEvents>> Start(int device, cudaStream_t stream,
                                                           cudaEvent_t ref, int64_t ref_host_ns);
  absl::Status RecordEnd(cudaStream_t stream);
  ~CudaEvents() override;
  absl::Status StreamWait() override;
  absl::Status Synchronize(absl::Duration timeout) override;
  bool Done() override;
  bool TimesNs(int64_t* start_ns, int64_t* end_ns) override;

 private:
  CudaEvents(int device, cudaEvent_t ref, int64_t ref_host_ns)
      : device_(device), ref_(ref), ref_host_ns_(ref_host_ns) {}
  const int device_;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
  const cudaEvent_t ref_;  // owned by the communicator, which outlives in-flight ops
  const int64_t ref_host_ns_;
};

}  // namespace ember::comm::nccl_internal

#endif  // EMBER_RUNTIME_COMM_NCCL_INTERNAL_H_
