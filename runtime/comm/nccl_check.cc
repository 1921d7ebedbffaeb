// Device builds only: the start-up check of the CUDA driver, runtime and compute capability, and
// the CUDA events behind stream-ordered Work (nccl_internal.h).
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/comm/comm_driver.h"
#include "runtime/comm/nccl_internal.h"

namespace ember::comm::nccl_internal {
namespace {

std::string Version(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

}  // namespace

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ") in ", what));
}

absl::StatusOr<int> CheckCudaDevice(const std::string& device) {
  int ordinal = -1;
  if (!absl::StartsWith(device, "cuda:") || !absl::SimpleAtoi(device.substr(5), &ordinal) ||
      ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", device, "' is not cuda:N; the nccl backends bind a CUDA device"));
  }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  cudaRuntimeGetVersion(&runtime);
  if (driver < runtime) {
    return absl::FailedPreconditionError(absl::StrCat(
        driver == 0 ? std::string("no CUDA driver found")
                    : absl::StrCat("the CUDA driver supports CUDA ", Version(driver)),
        "; this build's runtime is CUDA ", Version(runtime), ", which needs a driver for CUDA ",
        Version(runtime), " or newer (the minimum): install or update the NVIDIA driver"));
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return CudaStatus(e, "cudaGetDeviceCount");
  if (ordinal >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device, " does not exist: ", count, " CUDA device(s) visible"));
  }
  cudaDeviceProp p;
  e = cudaGetDeviceProperties(&p, ordinal);
  if (e != cudaSuccess) return CudaStatus(e, "cudaGetDeviceProperties");
  const int sm = p.major * 10 + p.minor;
  if (sm < kMinSm) {
    return absl::FailedPreconditionError(absl::StrCat(
        device, " (", p.name, ") has compute capability ", p.major, ".", p.minor,
        "; the nccl backends need at least ", kMinSm / 10, ".", kMinSm % 10, " (sm_", kMinSm,
        "); CUDA driver ", Version(driver), ", runtime ", Version(runtime)));
  }
  return ordinal;
}

absl::StatusOr<std::shared_ptr<CudaEvents>> CudaEvents::Start(int device, cudaStream_t stream,
                                                              cudaEvent_t ref,
                                                              int64_t ref_host_ns) {
  std::shared_ptr<CudaEvents> ev(new CudaEvents(device, ref, ref_host_ns));
  if (auto e = cudaEventCreate(&ev->start_); e != cudaSuccess) return CudaStatus(e, "cudaEventCreate");
  if (auto e = cudaEventCreate(&ev->end_); e != cudaSuccess) return CudaStatus(e, "cudaEventCreate");
  if (auto e = cudaEventRecord(ev->start_, stream); e != cudaSuccess)
    return CudaStatus(e, "cudaEventRecord(start)");
  return ev;
}

absl::Status CudaEvents::RecordEnd(cudaStream_t stream) {
  return CudaStatus(cudaEventRecord(end_, stream), "cudaEventRecord(end)");
}

CudaEvents::~CudaEvents() {
  if (start_) cudaEventDestroy(start_);
  if (end_) cudaEventDestroy(end_);
}

absl::Status CudaEvents::StreamWait() {
  cudaSetDevice(device_);
  return CudaStatus(cudaStreamWaitEvent(static_cast<cudaStream_t>(CurrentStream()), end_, 0),
                    "cudaStreamWaitEvent (Work::Wait)");
}

absl::Status CudaEvents::Synchronize(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    cudaError_t e = cudaEventQuery(end_);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return CudaStatus(e, "cudaEventQuery (Work::Wait)");
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "device op not finished within ", absl::FormatDuration(timeout), " (Work::Wait)"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

bool CudaEvents::Done() { return cudaEventQuery(end_) == cudaSuccess; }

bool CudaEvents::TimesNs(int64_t* start_ns, int64_t* end_ns) {
  if (!Done()) return false;
  float a = 0, b = 0;
  if (cudaEventElapsedTime(&a, ref_, start_) != cudaSuccess ||
      cudaEventElapsedTime(&b, ref_, end_) != cudaSuccess) {
    return false;
  }
  *start_ns = ref_host_ns_ + static_cast<int64_t>(a * 1e6);
  *end_ns = ref_host_ns_ + static_cast<int64_t>(b * 1e6);
  return true;
}

}  // namespace ember::comm::nccl_internal
