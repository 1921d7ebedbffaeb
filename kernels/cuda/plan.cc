#include "kernels/cuda/plan.h"

#include <algorithm>

namespace ember::kernels::cuda {
namespace {
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }
}  // namespace

Launch ElementwiseLaunch(int64_t n, int vec) {
  if (n <= 0) return {};
  const int64_t items = CeilDiv(n, std::max(vec, 1));
  return {std::min(CeilDiv(items, 256), kMaxGrid), 256};
}

Launch RowLaunch(int64_t N, int64_t C, int vec, int items_per_thread) {
  if (N <= 0 || C <= 0) return {};
  const int64_t vectors = CeilDiv(C, std::max(vec, 1));
  int64_t threads = RoundUp(CeilDiv(vectors, std::max(items_per_thread, 1)), kWarp);
  threads = std::clamp<int64_t>(threads, kWarp, 1024);
  return {N, static_cast<int>(threads)};
}

ColumnReducePlan PlanColumnReduce(int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return {};
  // About 64 rows per segment keeps the partial buffer at N/64 x C floats while giving
  // ceil(C/256) x segments blocks of parallelism.
  // Segments are a grid dimension (at most 65535).
  const int64_t rows = std::max({int64_t{1}, std::min<int64_t>(64, N), CeilDiv(N, 65535)});
  return {CeilDiv(N, rows), rows};
}

std::vector<MultiTensorBatch> PlanMultiTensor(const std::vector<int64_t>& sizes, int64_t chunk) {
  std::vector<MultiTensorBatch> out;
  MultiTensorBatch cur;
  int64_t global = 0;
  auto flush = [&] {
    if (!cur.chunks.empty()) out.push_back(std::move(cur));
    cur = MultiTensorBatch{};
    cur.first_chunk = global;
  };
  for (int t = 0; t < static_cast<int>(sizes.size()); ++t) {
    const int64_t nchunks = CeilDiv(std::max<int64_t>(sizes[t], 0), chunk);
    for (int64_t c = 0; c < nchunks; ++c) {
      if (static_cast<int>(cur.chunks.size()) == kMaxChunksPerBatch ||
          ((cur.tensors.empty() || cur.tensors.back() != t) &&
           static_cast<int>(cur.tensors.size()) == kMaxTensorsPerBatch)) {
        flush();
      }
      if (cur.tensors.empty() || cur.tensors.back() != t) cur.tensors.push_back(t);
      cur.chunks.emplace_back(static_cast<int>(cur.tensors.size()) - 1, c);
      ++global;
    }
  }
  flush();
  return out;
}

int64_t NumChunks(const std::vector<int64_t>& sizes, int64_t chunk) {
  int64_t n = 0;
  for (int64_t s : sizes) n += CeilDiv(std::max<int64_t>(s, 0), chunk);
  return n;
}

LcePlan PlanLce(int64_t N, int64_t V, int64_t token_chunk, int64_t vocab_chunk,
                int64_t budget_bytes) {
  LcePlan p;
  if (N <= 0 || V <= 0) return p;
  if (budget_bytes <= 0) budget_bytes = int64_t{64} << 20;
  p.vocab_chunk = vocab_chunk > 0 ? std::min(vocab_chunk, V) : std::min<int64_t>(8192, V);
  constexpr int64_t kRowStateFloats = 6;
  if (token_chunk > 0) {
    p.token_chunk = std::min(token_chunk, N);
  } else {
    const int64_t per_token = p.vocab_chunk * 4 + kRowStateFloats * 4;
    int64_t t = (budget_bytes - 2 * 256) / per_token / 64 * 64;
    p.token_chunk = std::clamp<int64_t>(t, 64, RoundUp(N, 64));
  }
  p.num_token_chunks = CeilDiv(N, p.token_chunk);
  p.num_vocab_chunks = CeilDiv(V, p.vocab_chunk);
  p.tile_bytes = p.token_chunk * p.vocab_chunk * 4;
  p.row_state_bytes = kRowStateFloats * p.token_chunk * 4;
  p.workspace_bytes = RoundUp(p.tile_bytes, 256) + RoundUp(p.row_state_bytes, 256);
  return p;
}

}  // namespace ember::kernels::cuda
