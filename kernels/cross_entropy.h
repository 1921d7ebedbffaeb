// Fused linear cross-entropy: the loss of softmax(h @ W^T) against integer targets, and the
// gradients of h and W, without materialising the N x V logits.
//
// Per valid token n (target y = targets[n] != ignore_index), with z = W h[n] (length V),
// lse = log sum_j exp(z_j), eps = label_smoothing, zc = z_loss:
//   loss_n = lse - (1 - eps) z_y - (eps / V) sum_j z_j + zc * lse^2
//   dz_j   = softmax_j(z) (1 + 2 zc lse) - (1 - eps) [j == y] - eps / V
// Reduction kMean divides by the number of valid tokens (loss 0 when there are none), kSum does not.
// This matches torch.nn.functional.cross_entropy(label_smoothing=eps) plus zc * lse^2.
//
// Tokens are processed in chunks of `token_chunk` valid rows (ignored tokens are dropped before
// the projection); inside a chunk the logits come from one GEMM over the whole vocabulary and the
// log-sum-exp runs online over tiles of `vocab_chunk` columns. The dh product splits the
// vocabulary into 4 fixed parts summed in order. Workspace is token_chunk x V floats (plus five
// token_chunk x d buffers), independent of N. Deterministic for any thread count in deterministic
// mode.
//
// With ctx.bf16_linear the fused version's three GEMMs (logits, dh, dW) take bf16-rounded inputs
// (W, h and the logit gradients) and accumulate in fp32 (GemmBf16); the log-sum-exp, the loss and
// the gradient formula stay fp32. The materialised reference ignores it (always fp32).
//
// Tied weights: dW is accumulated, so pass the token-embedding gradient buffer to add the LM-head
// gradient to it.
//
// Thread safety: reentrant; blocks until done.
#ifndef EMBER_KERNELS_CROSS_ENTROPY_H_
#define EMBER_KERNELS_CROSS_ENTROPY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/exec_context.h"

namespace ember::kernels {

struct LceOptions {
  enum class Reduction { kMean, kSum };
  int64_t ignore_index = -100;
  float label_smoothing = 0.0f;
  float z_loss = 0.0f;
  Reduction reduction = Reduction::kMean;
  int64_t token_chunk = 0;     // 0: auto, about 224 MiB of logits per chunk
  int64_t vocab_chunk = 4096;
};

struct LceResult {
  double loss = 0;
  int64_t num_valid = 0;
};

// h[N,d], W[V,d], targets[N]. dh[N,d] written (rows of ignored tokens are zero); dW[V,d]
// accumulated. Pass dh = dW = nullptr for the loss only. dloss scales the gradients (upstream
// gradient of the reduced loss). InvalidArgument if a target is outside [0, V) and not ignored.
absl::StatusOr<LceResult> FusedLinearCrossEntropy(const ExecContext& ctx, const LceOptions& opt,
                                                  const float* h, const float* W,
                                                  const int32_t* targets, int64_t N, int64_t d,
                                                  int64_t V, float* dh, float* dW,
                                                  float dloss = 1.0f);

// Reference with the same contract that materialises all N x V logits (one buffer, gradient
// computed in place). For tests and the benchmark baseline.
absl::StatusOr<LceResult> MaterialisedLinearCrossEntropy(const ExecContext& ctx,
                                                         const LceOptions& opt, const float* h,
                                                         const float* W, const int32_t* targets,
                                                         int64_t N, int64_t d, int64_t V,
                                                         float* dh, float* dW, float dloss = 1.0f);

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_CROSS_ENTROPY_H_
