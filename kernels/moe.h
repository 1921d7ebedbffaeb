// Mixture-of-experts routing and the grouped expert GEMM (CPU reference; kernels/cuda has the GPU
// version with the same contract).
//
// Routing: for token n, the k experts with the largest router logits[n, :] (ties: the lower expert
// index), and their weights = softmax over those k logits. Slots are (n, i) for i < k, slot index
// n*k + i, in decreasing logit order.
// Permutation: the slots sorted by expert, stable (slot order within an expert), as `order`
// (order[p] = slot index) and offsets[E + 1] (expert e owns positions [offsets[e], offsets[e+1])).
// Grouped linear: Y[p, :] = X[p, :] @ W[e]^T for every position p of expert e, where X rows are
// already gathered in `order` (X[p] = h[order[p] / k]) and W is [E, out, in].
//
// Thread safety: reentrant. Deterministic for any thread count.
#ifndef EMBER_KERNELS_MOE_H_
#define EMBER_KERNELS_MOE_H_

#include <cstdint>

#include "kernels/exec_context.h"

namespace ember::kernels {

// logits[N, E]; expert[N*k], weight[N*k] written. 1 <= k <= E.
void MoeRoute(const ExecContext& ctx, const float* logits, int64_t N, int64_t E, int k,
              int32_t* expert, float* weight);
// expert[S] (S = N*k slots) -> order[S], offsets[E + 1].
void MoePermute(const int32_t* expert, int64_t S, int64_t E, int32_t* order, int64_t* offsets);
// X[S, in], W[E, out, in], offsets[E + 1] -> Y[S, out] (written).
void GroupedLinearForward(const ExecContext& ctx, const float* X, const float* W,
                          const int64_t* offsets, int64_t E, int64_t in, int64_t out, float* Y);

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_MOE_H_
