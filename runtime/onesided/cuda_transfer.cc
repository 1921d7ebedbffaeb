#include "runtime/onesided/cuda_transfer.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ember::onesided::internal {

absl::StatusOr<std::string> ExportCudaRegion(void* ptr, uint64_t bytes) {
  absl::Status st = cuda_ipc::Available();
  std::string key;
  if (st.ok() && bytes > 0) {
    absl::StatusOr<std::string> k = cuda_ipc::Export(ptr, bytes);
    if (k.ok()) key = std::move(*k);
    st = k.status();
  }
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("RegisterMemory(kCuda, ", bytes, " bytes): ", st.message()));
  }
  return key;
}

absl::Status CheckCudaList(const char* verb, int cuda_remotes, int cuda_locals, size_t n) {
  if (cuda_remotes == static_cast<int>(n)) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      verb, ": ", cuda_remotes, " of ", n, " remote regions are GPU regions (CUDA IPC) and ",
      cuda_locals, " local ones are; a transfer list goes either through CUDA IPC (every remote "
      "region a peer's GPU region) or through UCX (host regions only: this UCX has no GPU "
      "support); split the list, or stage GPU data through host memory"));
}

Work StartCudaCopies(std::shared_ptr<WorkState> state, const std::vector<cuda_ipc::Copy>& copies,
                     std::vector<std::shared_ptr<cuda_ipc::Mapping>> mappings, void* stream) {
  absl::StatusOr<bool> captured = cuda_ipc::CopyAsync(
      copies, stream, [state, mappings = std::move(mappings)] { state->PartDone(absl::OkStatus()); });
  if (!captured.ok()) {
    state->PartDone(absl::Status(captured.status().code(),
                                 absl::StrCat(state->what(), ": ", captured.status().message())));
  } else if (*captured) {
    state->PartDone(absl::OkStatus());  // enqueued into the graph being captured
  }
  return Work(std::move(state));
}

}  // namespace ember::onesided::internal
