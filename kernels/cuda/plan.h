// Host-side plans for the CUDA kernels: launch shapes, deterministic reduction splits, the
// multi-tensor batches of AdamW / norm / clipping and the chunking of fused linear cross-entropy.
// Pure C++ (no CUDA headers): everything here is tested on CPU (plan_test.cc), and the kernels
// take these plans as they are, so a wrong plan shows up here rather than on a GPU.
//
// Thread safety: pure functions and value types.
#ifndef EMBER_KERNELS_CUDA_PLAN_H_
#define EMBER_KERNELS_CUDA_PLAN_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace ember::kernels::cuda {

inline constexpr int kWarp = 32;
inline constexpr int64_t kMaxGrid = 65535LL * 8;  // grid-stride loops cover anything larger

struct Launch {
  int64_t grid = 0;  // blocks (0: nothing to do)
  int block = 0;     // threads per block
};

// Elementwise over n items handled `vec` at a time: 256-thread blocks, grid-stride beyond kMaxGrid.
Launch ElementwiseLaunch(int64_t n, int vec = 1);

// One block per row of C elements read `vec` at a time: the block is the smallest multiple of 32
// threads (32..1024) that gives each thread at most `items_per_thread` vectors; grid = N rows.
Launch RowLaunch(int64_t N, int64_t C, int vec, int items_per_thread = 8);

// Deterministic column sums out[c] += sum_n f(n, c): rows are cut into `segments` fixed runs of
// `rows_per_segment` (a function of N alone, never of the device), each summed in order into a
// partial row; the partial rows are then added in segment order. At most 65535 segments (a grid
// dimension): 64 rows each up to 4M rows, more beyond.
struct ColumnReducePlan {
  int64_t segments = 0;
  int64_t rows_per_segment = 0;
};
ColumnReducePlan PlanColumnReduce(int64_t N, int64_t C);

// Multi-tensor launches (apex-style): tensors are cut into fixed chunks of `chunk` elements and
// the (tensor, chunk) pairs grouped into batches that fit one kernel's parameter block: at most
// kMaxTensorsPerBatch tensors and kMaxChunksPerBatch chunks each. A tensor may span batches.
inline constexpr int kMaxTensorsPerBatch = 24;
inline constexpr int kMaxChunksPerBatch = 320;
inline constexpr int64_t kMultiTensorChunk = 1 << 14;  // = the CPU GlobalL2Norm chunk
struct MultiTensorBatch {
  std::vector<int> tensors;                    // indices into the caller's list, ascending
  std::vector<std::pair<int, int64_t>> chunks;  // (position in `tensors`, chunk index)
  int64_t first_chunk = 0;                     // global index of chunks[0] (for partial sums)
};
std::vector<MultiTensorBatch> PlanMultiTensor(const std::vector<int64_t>& sizes,
                                              int64_t chunk = kMultiTensorChunk);
// Total chunks of a list (the length of the per-chunk partial-sum buffer).
int64_t NumChunks(const std::vector<int64_t>& sizes, int64_t chunk = kMultiTensorChunk);

// Fused linear cross-entropy on the GPU: tokens in chunks of `token_chunk`, the vocabulary in
// tiles of `vocab_chunk`; one fp32 logits tile of token_chunk x vocab_chunk is the only
// vocabulary-sized buffer, so memory is independent of N and V beyond that tile.
struct LcePlan {
  int64_t token_chunk = 0;
  int64_t vocab_chunk = 0;
  int64_t num_token_chunks = 0;
  int64_t num_vocab_chunks = 0;
  int64_t tile_bytes = 0;       // token_chunk * vocab_chunk * 4
  int64_t row_state_bytes = 0;  // per-token running max, sum, target logit, logit sum, lse, loss
  int64_t workspace_bytes = 0;  // tile + row state (+ 256-byte alignment of each part)
};
// budget_bytes caps workspace_bytes (0: 64 MiB). vocab_chunk/token_chunk 0 pick them: vocab tiles
// of 8192 columns (fewer when V is smaller) and as many tokens as the budget allows, rounded down
// to a multiple of 64 (at least 64, at most N rounded up to 64).
LcePlan PlanLce(int64_t N, int64_t V, int64_t token_chunk = 0, int64_t vocab_chunk = 0,
                int64_t budget_bytes = 0);

}  // namespace ember::kernels::cuda

#endif  // EMBER_KERNELS_CUDA_PLAN_H_
