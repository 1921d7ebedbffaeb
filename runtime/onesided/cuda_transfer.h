// Internal to runtime/onesided: the agent's CUDA IPC paths (agent.h states the contract; cuda_ipc.h
// does the CUDA work). Thread-safe.
#ifndef EMBER_RUNTIME_ONESIDED_CUDA_TRANSFER_H_
#define EMBER_RUNTIME_ONESIDED_CUDA_TRANSFER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/onesided/cuda_ipc.h"
#include "runtime/onesided/work.h"

namespace ember::onesided::internal {

// The export a kCuda region's descriptor carries ("" for 0 bytes), or the refusal naming the call.
absl::StatusOr<std::string> ExportCudaRegion(void* ptr, uint64_t bytes);

// OK when a transfer list of `n` elements with `cuda_remotes` GPU remote regions and `cuda_locals`
// GPU local ones can go through CUDA IPC (every remote a GPU region); UNIMPLEMENTED for a mix.
absl::Status CheckCudaList(const char* verb, int cuda_remotes, int cuda_locals, size_t n);

// Enqueues `copies` on `stream`: `state` (one part) finishes when they did, at once when the stream
// is capturing a graph, or with the enqueue's error. `mappings` stay open until the copies ended.
Work StartCudaCopies(std::shared_ptr<WorkState> state, const std::vector<cuda_ipc::Copy>& copies,
                     std::vector<std::shared_ptr<cuda_ipc::Mapping>> mappings, void* stream);

}  // namespace ember::onesided::internal

#endif  // EMBER_RUNTIME_ONESIDED_CUDA_TRANSFER_H_
