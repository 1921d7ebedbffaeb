#include "kernels/moe.h"

#include <cmath>
#include <vector>

#include "kernels/gemm.h"

namespace ember::kernels {

void MoeRoute(const ExecContext& ctx, const float* logits, int64_t N, int64_t E, int k,
              int32_t* expert, float* weight) {
  auto body = [&](int64_t b, int64_t e) {
    std::vector<char> taken(E);
    for (int64_t n = b; n < e; ++n) {
      const float* row = logits + n * E;
      std::fill(taken.begin(), taken.end(), 0);
      float top = 0, sum = 0;
      for (int i = 0; i < k; ++i) {
        int64_t best = -1;
        for (int64_t j = 0; j < E; ++j)
          if (!taken[j] && (best < 0 || row[j] > row[best])) best = j;
        taken[best] = 1;
        expert[n * k + i] = static_cast<int32_t>(best);
        if (i == 0) top = row[best];
        weight[n * k + i] = std::exp(row[best] - top);
        sum += weight[n * k + i];
      }
      for (int i = 0; i < k; ++i) weight[n * k + i] /= sum;
    }
  };
  if (ctx.pool) ctx.pool->ParallelFor(N, 64, body); else if (N > 0) body(0, N);
}

void MoePermute(const int32_t* expert, int64_t S, int64_t E, int32_t* order, int64_t* offsets) {
  std::vector<int64_t> next(E + 1, 0);
  for (int64_t s = 0; s < S; ++s) ++next[expert[s] + 1];
  for (int64_t e = 0; e < E; ++e) next[e + 1] += next[e];
  for (int64_t e = 0; e <= E; ++e) offsets[e] = next[e];
  for (int64_t s = 0; s < S; ++s) order[next[expert[s]]++] = static_cast<int32_t>(s);
}

void GroupedLinearForward(const ExecContext& ctx, const float* X, const float* W,
                          const int64_t* offsets, int64_t E, int64_t in, int64_t out, float* Y) {
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    Gemm(ctx, false, true, rows, out, in, 1.0f, X + offsets[e] * in, in, W + e * out * in, in,
         0.0f, Y + offsets[e] * out, out);
  }
}

}  // namespace ember::kernels
