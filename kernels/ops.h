// CPU forward/backward kernels for the GPT model: embedding, RMSNorm, linear, GELU (tanh),
// SwiGLU, row softmax, residual add, AdamW and global-norm gradient clipping.
//
// Conventions: fp32, contiguous row-major. Shapes are in the comments: N = rows (tokens),
// C = channels. "written" outputs are overwritten; "accumulated" outputs get `+=` (so gradients of
// shared or tied parameters add up; zero them before the first backward of a step). Inputs and
// outputs must not alias unless stated. Every kernel is deterministic for any thread count:
// per-row work is independent of the split and column reductions (dW, db, d-embedding) give each
// thread whole columns summed over rows in order.
//
// Thread safety: reentrant; calls run on ctx.pool and block until done.
#ifndef EMBER_KERNELS_OPS_H_
#define EMBER_KERNELS_OPS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/exec_context.h"

namespace ember::kernels {

// out[n,:] (=|+=) table[ids[n],:].  ids[N] in [0,V), table[V,C], out[N,C].
void EmbeddingForward(const ExecContext& ctx, const int32_t* ids, int64_t N, const float* table,
                      int64_t C, float* out, bool accumulate);
// dtable[ids[n],:] += dout[n,:] (accumulated).
void EmbeddingBackward(const ExecContext& ctx, const int32_t* ids, int64_t N, const float* dout,
                       int64_t C, float* dtable);

// y = x * rstd * w with rstd[n] = 1/sqrt(mean_c x[n,c]^2 + eps).  x,y[N,C], w[C], rstd[N] (saved
// for backward; written).
void RmsNormForward(const ExecContext& ctx, const float* x, const float* w, int64_t N, int64_t C,
                    float eps, float* y, float* rstd);
// dx written, dw accumulated.
void RmsNormBackward(const ExecContext& ctx, const float* x, const float* w, const float* rstd,
                     const float* dy, int64_t N, int64_t C, float* dx, float* dw);

// y[N,out] = x[N,in] @ W[out,in]^T + b[out] (b may be null). With ctx.bf16_linear the GEMMs of
// both functions take their inputs (x, W, dy) rounded to bf16 and accumulate in fp32 (GemmBf16);
// the bias and its gradient stay fp32.
void LinearForward(const ExecContext& ctx, const float* x, const float* W, const float* b,
                   int64_t N, int64_t in, int64_t out, float* y);
// dx[N,in] written (skipped when null, and then W may be null); dW[out,in] and db[out]
// accumulated (either may be null: skipped).
void LinearBackward(const ExecContext& ctx, const float* x, const float* W, const float* dy,
                    int64_t N, int64_t in, int64_t out, float* dx, float* dW, float* db);

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), n elements. dx written.
void GeluForward(const ExecContext& ctx, const float* x, float* y, int64_t n);
void GeluBackward(const ExecContext& ctx, const float* x, const float* dy, float* dx, int64_t n);

// x[N,2F] = [a | b] -> y[N,F] = silu(a) * b, silu(a) = a * sigmoid(a). dx[N,2F] written.
void SwiGluForward(const ExecContext& ctx, const float* x, int64_t N, int64_t F, float* y);
void SwiGluBackward(const ExecContext& ctx, const float* x, const float* dy, int64_t N, int64_t F,
                    float* dx);

// Row softmax: y[N,C]; backward dx = y * (dy - sum(dy * y)), written. dx may alias dy.
void SoftmaxForward(const ExecContext& ctx, const float* x, int64_t N, int64_t C, float* y);
void SoftmaxBackward(const ExecContext& ctx, const float* y, const float* dy, int64_t N, int64_t C,
                     float* dx);

// out = a + b (out may alias a or b); y += x.
void Add(const ExecContext& ctx, const float* a, const float* b, float* out, int64_t n);
void AddInPlace(const ExecContext& ctx, const float* x, float* y, int64_t n);

// Defaults are the job spec's optimizer defaults (docs/model.md), not torch.optim.AdamW's
// (beta2 0.999, weight_decay 0.01).
struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};
// One AdamW step (PyTorch semantics): p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps). step counts from 1.
void AdamWStep(const ExecContext& ctx, const AdamWOptions& opt, int64_t step, float* param,
               const float* grad, float* m, float* v, int64_t n);

// sqrt(sum of squares) over all tensors, summed in double over fixed 16K-element chunks in order.
double GlobalL2Norm(const ExecContext& ctx, const std::vector<std::pair<const float*, int64_t>>& ts);
// Scales every tensor by max_norm / (norm + 1e-6) when norm > max_norm; returns the norm before
// clipping (PyTorch clip_grad_norm_ semantics).
double ClipGradNorm(const ExecContext& ctx, const std::vector<std::pair<float*, int64_t>>& ts,
                    double max_norm);

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_OPS_H_
