// ember::onesided::cuda_ipc: the GPU-memory backend of the one-sided layer on one node. A process
// exports a device region as CUDA IPC bytes (cudaIpcGetMemHandle of the allocation holding it, plus
// the region's offset in it); a peer process opens them (cudaIpcOpenMemHandle) and copies to or
// from the region with cudaMemcpyAsync on the caller's stream, so transfers are ordered with the
// caller's kernels and can be captured in a CUDA graph. Agent (agent.h) uses it for MemoryKind::kCuda
// and for peers' CUDA descriptors; it depends on nothing but the CUDA runtime, so a GPU check can
// run it where UCX and the store are absent (tests/gpu/onesided_cuda_ipc_check.cc).
//
// Where it cannot work, every call refuses with a status instead of crashing: UNIMPLEMENTED in a
// build without CUDA (@local_cuda found no toolkit); FAILED_PRECONDITION naming the CUDA error where
// the runtime finds no driver or no device (a CPU-only machine).
//
// Thread safety: functions are thread-safe; a Mapping may be used by any thread (CUDA's rules on
// the streams passed in apply). Ownership: the exporter keeps its allocation alive while peers
// have it open; a Mapping closes its handle when destroyed (after the copies using it finished).
#ifndef EMBER_RUNTIME_ONESIDED_CUDA_IPC_H_
#define EMBER_RUNTIME_ONESIDED_CUDA_IPC_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::onesided::cuda_ipc {

// OK where a CUDA device is usable from this process; the refusal described above otherwise.
absl::Status Available();

// The exported form of [ptr, ptr + bytes) in device memory: starts with kMagic, so IsExported tells
// it from a UCX remote key. INVALID_ARGUMENT when ptr is not device memory.
inline constexpr absl::string_view kMagic = "ECUDAIPC1";
absl::StatusOr<std::string> Export(const void* ptr, uint64_t bytes);
bool IsExported(absl::string_view key);

// A peer's exported region opened in this process.
class Mapping {
 public:
  // `bytes` is the region's length from its descriptor. FAILED_PRECONDITION where CUDA is absent or
  // the handle cannot be opened (another node, the exporter exited, the same process).
  static absl::StatusOr<std::unique_ptr<Mapping>> Open(absl::string_view exported, uint64_t bytes);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* ptr() const { return ptr_; }  // the region (device memory, this process's address)
  uint64_t bytes() const { return bytes_; }

 private:
  Mapping(void* base, void* ptr, uint64_t bytes) : base_(base), ptr_(ptr), bytes_(bytes) {}
  void* base_;  // what cudaIpcOpenMemHandle returned (closed in the destructor)
  void* ptr_;
  uint64_t bytes_;
};

struct Copy {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t bytes = 0;
};

// Enqueues `copies` (device or host pointers: cudaMemcpyDefault) on `stream` (a cudaStream_t;
// null = the legacy default stream); work the caller enqueues on that stream later runs after them.
// Returns true when the stream is capturing a graph: the copies became graph nodes and `done` is
// dropped (each launch of the graph is ordered on its stream). Otherwise `done` runs on a
// CUDA-internal thread once the copies finished (cudaLaunchHostFunc; it must not call CUDA); after
// an asynchronous CUDA error it may never run, and the stream reports the error on later calls.
// The status is the enqueue's (a bad pointer, no device...).
absl::StatusOr<bool> CopyAsync(const std::vector<Copy>& copies, void* stream,
                               std::function<void()> done);

}  // namespace ember::onesided::cuda_ipc

#endif  // EMBER_RUNTIME_ONESIDED_CUDA_IPC_H_
