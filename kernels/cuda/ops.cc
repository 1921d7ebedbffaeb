// Host wrappers of the CUDA ops (cuda_ops.h): launch shapes from plan.h, workspaces from the
// context's caching allocator, the kernels from launch.h, GEMM tiles from context.cc.
#include "kernels/cuda/cuda_ops.h"

#ifdef EMBER_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/plan.h"
#include "kernels/cuda/status.h"

namespace ember::kernels::cuda {
namespace {

cudaStream_t S(CudaContext& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }

// A workspace from the context's allocator, returned when the scope ends. Stream-ordered reuse is
// safe: every use is queued on the context's one stream before the block can be handed out again.
class Scratch {
 public:
  explicit Scratch(CachingAllocator& a) : a_(a) {}
  ~Scratch() {
    for (void* p : ptrs_) a_.Free(p).IgnoreError();
  }
  template <typename T>
  absl::StatusOr<T*> Get(int64_t count) {
    absl::StatusOr<void*> p = a_.Allocate(static_cast<size_t>(count) * sizeof(T));
    if (!p.ok()) return p.status();
    ptrs_.push_back(*p);
    return static_cast<T*>(*p);
  }

 private:
  CachingAllocator& a_;
  std::vector<void*> ptrs_;
};

#define EMBER_ASSIGN_OR_RETURN_PTR(lhs, expr) \
  auto lhs##_or = (expr);                     \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *lhs##_or

int64_t Grid(int64_t n, int vec = 1) { return ElementwiseLaunch(n, vec).grid; }

// Runs fn(batch args) for each multi-tensor batch of plan.h over tensors[i] = (p, g, m, v, n).
template <typename Fn>
absl::Status ForEachBatch(const std::vector<AdamWTensor>& ts, Fn fn) {
  std::vector<int64_t> sizes;
  sizes.reserve(ts.size());
  for (const auto& t : ts) sizes.push_back(t.n);
  for (const MultiTensorBatch& b : PlanMultiTensor(sizes)) {
    detail::TensorBatchArgs a{};
    for (size_t i = 0; i < b.tensors.size(); ++i) {
      const AdamWTensor& t = ts[b.tensors[i]];
      a.p[i] = t.param;
      a.g[i] = t.grad;
      a.m[i] = t.m;
      a.v[i] = t.v;
      a.n[i] = t.n;
    }
    for (size_t i = 0; i < b.chunks.size(); ++i) {
      a.chunk_tensor[i] = static_cast<int16_t>(b.chunks[i].first);
      a.chunk_index[i] = static_cast<int32_t>(b.chunks[i].second);
    }
    a.num_chunks = static_cast<int>(b.chunks.size());
    a.chunk = kMultiTensorChunk;
    a.first_chunk = b.first_chunk;
    EMBER_CUDA_RETURN_IF_ERROR(fn(a), "multi-tensor launch");
  }
  return absl::OkStatus();
}

// Sum of squares of every tensor into partial[], then the norm (and clip scale) on the device.
absl::StatusOr<double> Norm(CudaContext& ctx, const std::vector<AdamWTensor>& ts,
                            double max_norm, bool clip) {
  std::vector<int64_t> sizes;
  for (const auto& t : ts) sizes.push_back(t.n);
  const int64_t chunks = NumChunks(sizes);
  Scratch scratch(ctx.allocator());
  EMBER_ASSIGN_OR_RETURN_PTR(partial, scratch.Get<double>(std::max<int64_t>(chunks, 1)));
  EMBER_ASSIGN_OR_RETURN_PTR(norm, scratch.Get<double>(1));
  EMBER_ASSIGN_OR_RETURN_PTR(scale, scratch.Get<float>(1));
  absl::Status st = ForEachBatch(
      ts, [&](const detail::TensorBatchArgs& a) { return detail::SumSquares(a, partial, S(ctx)); });
  if (!st.ok()) return st;
  EMBER_CUDA_RETURN_IF_ERROR(
      detail::FinishNorm(partial, chunks, clip ? max_norm : 0.0, norm, clip ? scale : nullptr,
                         S(ctx)),
      "FinishNorm");
  if (clip) {
    st = ForEachBatch(
        ts, [&](const detail::TensorBatchArgs& a) { return detail::ScaleBy(a, scale, S(ctx)); });
    if (!st.ok()) return st;
  }
  double host = 0;
  EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&host, norm, sizeof(double), cudaMemcpyDeviceToHost,
                                             S(ctx)), "norm readback");
  if (absl::Status s = ctx.Synchronize(); !s.ok()) return s;
  return host;
}

}  // namespace

absl::Status CastF32ToBf16(CudaContext& ctx, const float* in, uint16_t* out, int64_t n) {
  return CudaStatus(detail::CastF32ToBf16(in, out, n, Grid(n), S(ctx)), "CastF32ToBf16");
}
absl::Status CastBf16ToF32(CudaContext& ctx, const uint16_t* in, float* out, int64_t n) {
  return CudaStatus(detail::CastBf16ToF32(in, out, n, Grid(n), S(ctx)), "CastBf16ToF32");
}

absl::Status EmbeddingForward(CudaContext& ctx, const int32_t* ids, int64_t N, const float* table,
                              int64_t C, float* out, bool accumulate) {
  return CudaStatus(
      detail::EmbeddingForward(ids, N, table, C, out, accumulate, Grid(N * C), S(ctx)),
      "EmbeddingForward");
}
absl::Status EmbeddingBackward(CudaContext& ctx, const int32_t* ids, int64_t N, const float* dout,
                               int64_t C, float* dtable) {
  return CudaStatus(detail::EmbeddingBackward(ids, N, dout, C, dtable, S(ctx)),
                    "EmbeddingBackward");
}

absl::Status RmsNormForward(CudaContext& ctx, const float* x, const float* w, int64_t N, int64_t C,
                            float eps, float* y, float* rstd) {
  const Launch l = RowLaunch(N, C, 4);
  return CudaStatus(detail::RmsNormForward(x, w, N, C, eps, y, rstd, l.block, S(ctx)),
                    "RmsNormForward");
}
absl::Status RmsNormBackward(CudaContext& ctx, const float* x, const float* w, const float* rstd,
                             const float* dy, int64_t N, int64_t C, float* dx, float* dw) {
  const Launch l = RowLaunch(N, C, 4);
  const ColumnReducePlan p = PlanColumnReduce(N, C);
  Scratch scratch(ctx.allocator());
  EMBER_ASSIGN_OR_RETURN_PTR(partial, scratch.Get<float>(std::max<int64_t>(p.segments * C, 1)));
  return CudaStatus(detail::RmsNormBackward(x, w, rstd, dy, N, C, dx, dw, partial, p.segments,
                                            p.rows_per_segment, l.block, S(ctx)),
                    "RmsNormBackward");
}

absl::Status GeluForward(CudaContext& ctx, const float* x, float* y, int64_t n) {
  return CudaStatus(detail::GeluForward(x, y, n, Grid(n), S(ctx)), "GeluForward");
}
absl::Status GeluBackward(CudaContext& ctx, const float* x, const float* dy, float* dx, int64_t n) {
  return CudaStatus(detail::GeluBackward(x, dy, dx, n, Grid(n), S(ctx)), "GeluBackward");
}
absl::Status Add(CudaContext& ctx, const float* a, const float* b, float* out, int64_t n) {
  return CudaStatus(detail::Add(a, b, out, n, Grid(n), S(ctx)), "Add");
}
absl::Status AddInPlace(CudaContext& ctx, const float* x, float* y, int64_t n) {
  return CudaStatus(detail::Add(y, x, y, n, Grid(n), S(ctx)), "AddInPlace");
}
absl::Status SwiGluForward(CudaContext& ctx, const float* x, int64_t N, int64_t F, float* y) {
  return CudaStatus(detail::SwiGluForward(x, N, F, y, Grid(N * F), S(ctx)), "SwiGluForward");
}
absl::Status SwiGluBackward(CudaContext& ctx, const float* x, const float* dy, int64_t N,
                            int64_t F, float* dx) {
  return CudaStatus(detail::SwiGluBackward(x, dy, N, F, dx, Grid(N * F), S(ctx)),
                    "SwiGluBackward");
}

absl::Status SoftmaxForward(CudaContext& ctx, const float* x, int64_t N, int64_t C, float* y) {
  const Launch l = RowLaunch(N, C, 4);
  return CudaStatus(detail::SoftmaxForward(x, N, C, y, l.block, S(ctx)), "SoftmaxForward");
}
absl::Status SoftmaxBackward(CudaContext& ctx, const float* y, const float* dy, int64_t N,
                             int64_t C, float* dx) {
  const Launch l = RowLaunch(N, C, 4);
  return CudaStatus(detail::SoftmaxBackward(y, dy, N, C, dx, l.block, S(ctx)), "SoftmaxBackward");
}

absl::Status AdamWStep(CudaContext& ctx, const AdamWOptions& opt, int64_t step,
                       const std::vector<AdamWTensor>& ts) {
  if (step < 1) return absl::InvalidArgumentError(absl::StrCat("AdamWStep: step ", step, " < 1"));
  // The same scalar algebra as the CPU AdamWStep.
  detail::AdamWArgs a;
  const float bc1 = 1.0f - static_cast<float>(std::pow(opt.beta1, static_cast<double>(step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(opt.beta2, static_cast<double>(step)));
  a.beta1 = opt.beta1;
  a.beta2 = opt.beta2;
  a.eps = opt.eps;
  a.decay = 1.0f - opt.lr * opt.weight_decay;
  a.step_size = opt.lr / bc1;
  a.inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  return ForEachBatch(
      ts, [&](const detail::TensorBatchArgs& b) { return detail::AdamW(b, a, S(ctx)); });
}

absl::StatusOr<double> GlobalL2Norm(CudaContext& ctx,
                                    const std::vector<std::pair<const float*, int64_t>>& ts) {
  std::vector<AdamWTensor> v;
  for (const auto& [p, n] : ts) v.push_back({const_cast<float*>(p), nullptr, nullptr, nullptr, n});
  return Norm(ctx, v, 0.0, /*clip=*/false);
}

absl::StatusOr<double> ClipGradNorm(CudaContext& ctx,
                                    const std::vector<std::pair<float*, int64_t>>& ts,
                                    double max_norm) {
  std::vector<AdamWTensor> v;
  for (const auto& [p, n] : ts) v.push_back({p, nullptr, nullptr, nullptr, n});
  return Norm(ctx, v, max_norm, /*clip=*/true);
}

namespace {
absl::StatusOr<detail::AttentionDims> Dims(const AttentionShape& s, int64_t qkv_stride,
                                           int64_t o_stride) {
  if (!detail::AttentionSupportsHeadDim(s.hd)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA attention supports head sizes 32 and 64, got ", s.hd, "; use the CPU kernel"));
  }
  const int64_t KV = s.kv_heads();
  if (s.H > 0 && (KV < 1 || s.H % KV != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA attention: KV = ", KV, " key/value heads must divide H = ", s.H, " query heads"));
  }
  if (s.B * s.H > 65535) {  // a grid dimension of the forward and dq kernels
    return absl::InvalidArgumentError(absl::StrCat("CUDA attention: B * H = ", s.B * s.H,
                                                   " exceeds 65535; split the batch"));
  }
  return detail::AttentionDims{s.B, s.T, s.H, s.hd, s.window, qkv_stride, o_stride, KV};
}
}  // namespace

absl::Status AttentionForward(CudaContext& ctx, const AttentionShape& s, const float* q,
                              const float* k, const float* v, int64_t qkv_stride, float* o,
                              int64_t o_stride, float* lse) {
  absl::StatusOr<detail::AttentionDims> d = Dims(s, qkv_stride, o_stride);
  if (!d.ok()) return d.status();
  return CudaStatus(detail::AttentionForward(*d, q, k, v, o, lse, S(ctx)), "AttentionForward");
}

absl::Status AttentionBackward(CudaContext& ctx, const AttentionShape& s, const float* q,
                               const float* k, const float* v, int64_t qkv_stride, const float* o,
                               const float* dout, int64_t o_stride, const float* lse, float* dq,
                               float* dk, float* dv) {
  absl::StatusOr<detail::AttentionDims> d = Dims(s, qkv_stride, o_stride);
  if (!d.ok()) return d.status();
  Scratch scratch(ctx.allocator());
  EMBER_ASSIGN_OR_RETURN_PTR(delta, scratch.Get<float>(std::max<int64_t>(s.B * s.H * s.T, 1)));
  return CudaStatus(
      detail::AttentionBackward(*d, q, k, v, o, dout, lse, delta, dq, dk, dv, S(ctx)),
      "AttentionBackward");
}

namespace {
absl::Status Rope(CudaContext& ctx, const RopeDeviceTable& tb, float* x, int64_t B, int64_t T,
                  int64_t heads, int64_t hd, int64_t stride, float sign, const char* what) {
  if (hd <= 0 || hd % 2 != 0 || tb.half != hd / 2) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": head size ", hd,
                                                   " must be even and twice the table's half ",
                                                   tb.half));
  }
  if (B < 0 || T < 0 || heads < 0 || tb.T < T || stride < heads * hd) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": B ", B, ", T ", T, ", heads ", heads, ", stride ", stride, " vs table T ", tb.T,
        "; need B, T, heads >= 0, table T >= T, stride >= heads * hd = ", heads * hd));
  }
  const int64_t n = B * T * heads * (hd / 2);
  if (n > 0 && (tb.cos == nullptr || tb.sin == nullptr || x == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null table or data pointer"));
  }
  return CudaStatus(detail::Rope(tb.cos, tb.sin, x, B, T, heads, hd, stride, sign, Grid(n),
                                 S(ctx)),
                    what);
}
}  // namespace

absl::Status RopeForward(CudaContext& ctx, const RopeDeviceTable& table, float* x, int64_t B,
                         int64_t T, int64_t heads, int64_t hd, int64_t stride) {
  return Rope(ctx, table, x, B, T, heads, hd, stride, 1.0f, "RopeForward");
}
absl::Status RopeBackward(CudaContext& ctx, const RopeDeviceTable& table, float* dx, int64_t B,
                          int64_t T, int64_t heads, int64_t hd, int64_t stride) {
  return Rope(ctx, table, dx, B, T, heads, hd, stride, -1.0f, "RopeBackward");
}

absl::Status MoeRoute(CudaContext& ctx, const float* logits, int64_t N, int64_t E, int k,
                      int32_t* expert, float* weight) {
  if (k < 1 || k > detail::MoeMaxK() || k > E) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRoute: k = ", k, " must be in [1, min(",
                                                   detail::MoeMaxK(), ", E = ", E, ")]"));
  }
  return CudaStatus(detail::MoeRoute(logits, N, E, k, expert, weight, Grid(N), S(ctx)),
                    "MoeRoute");
}

absl::Status MoePermute(CudaContext& ctx, const int32_t* expert, int64_t S_, int64_t E,
                        int32_t* order, int64_t* offsets) {
  return CudaStatus(detail::MoePermute(expert, S_, E, order, offsets, S(ctx)), "MoePermute");
}

absl::Status GroupedLinearForward(CudaContext& ctx, GemmInput in_type, const void* X,
                                  const void* W, const int64_t* offsets, int64_t E, int64_t in,
                                  int64_t out, float* Y) {
  std::vector<int64_t> off(E + 1);
  EMBER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(off.data(), offsets, (E + 1) * sizeof(int64_t),
                                             cudaMemcpyDeviceToHost, S(ctx)),
                             "offsets readback");
  if (absl::Status s = ctx.Synchronize(); !s.ok()) return s;
  const size_t esize = in_type == GemmInput::kBF16 ? 2 : 4;
  const char* x = static_cast<const char*>(X);
  const char* w = static_cast<const char*>(W);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = off[e + 1] - off[e];
    if (rows == 0) continue;
    absl::Status s = Gemm(ctx, in_type, false, true, rows, out, in, 1.0f, x + off[e] * in * esize,
                          in, w + e * out * in * esize, in, 0.0f, Y + off[e] * out, out);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<LceResult> FusedLinearCrossEntropy(CudaContext& ctx, const LceOptions& opt,
                                                  const float* h, const float* W,
                                                  const int32_t* targets, int64_t N, int64_t d,
                                                  int64_t V, float* dh, float* dW, float dloss,
                                                  int64_t budget_bytes) {
  if (N <= 0) return LceResult{};
  const LcePlan plan = PlanLce(N, V, opt.token_chunk, opt.vocab_chunk, budget_bytes);
  const bool mean = opt.reduction == LceOptions::Reduction::kMean;
  Scratch scratch(ctx.allocator());
  EMBER_ASSIGN_OR_RETURN_PTR(tile, scratch.Get<float>(plan.token_chunk * plan.vocab_chunk));
  EMBER_ASSIGN_OR_RETURN_PTR(state, scratch.Get<float>(5 * plan.token_chunk));
  EMBER_ASSIGN_OR_RETURN_PTR(totals, scratch.Get<double>(3));  // loss, valid, valid (all N)
  EMBER_ASSIGN_OR_RETURN_PTR(bad, scratch.Get<int>(1));
  EMBER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(totals, 0, 3 * sizeof(double), S(ctx)), "memset");
  EMBER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(bad, 0, sizeof(int), S(ctx)), "memset");
  const bool grads = dh != nullptr || dW != nullptr;
  if (grads) {
    EMBER_CUDA_RETURN_IF_ERROR(
        detail::LceCountValid(targets, N, opt.ignore_index, totals + 2, S(ctx)), "LceCountValid");
  }
  // tile[rows, cols] = h[t0 : t0+rows] @ W[v0 : v0+cols]^T
  auto logits = [&](int64_t t0, int64_t rows, int64_t v0, int64_t cols) {
    return Gemm(ctx, GemmInput::kF32, false, true, rows, cols, d, 1.0f, h + t0 * d, d,
                W + v0 * d, d, 0.0f, tile, cols);
  };
  for (int64_t t0 = 0; t0 < N; t0 += plan.token_chunk) {
    const int64_t rows = std::min(plan.token_chunk, N - t0);
    const int32_t* tg = targets + t0;
    EMBER_CUDA_RETURN_IF_ERROR(detail::LceInitRows(rows, state, S(ctx)), "LceInitRows");
    for (int64_t v0 = 0; v0 < V; v0 += plan.vocab_chunk) {
      const int64_t cols = std::min(plan.vocab_chunk, V - v0);
      if (absl::Status s = logits(t0, rows, v0, cols); !s.ok()) return s;
      EMBER_CUDA_RETURN_IF_ERROR(
          detail::LceUpdateRows(tile, rows, cols, v0, tg, opt.ignore_index, state, S(ctx)),
          "LceUpdateRows");
    }
    EMBER_CUDA_RETURN_IF_ERROR(
        detail::LceFinishRows(rows, tg, V, opt.ignore_index, opt.label_smoothing, opt.z_loss,
                              state, totals, bad, S(ctx)),
        "LceFinishRows");
    if (!grads) continue;
    for (int64_t v0 = 0; v0 < V; v0 += plan.vocab_chunk) {
      const int64_t cols = std::min(plan.vocab_chunk, V - v0);
      if (absl::Status s = logits(t0, rows, v0, cols); !s.ok()) return s;
      EMBER_CUDA_RETURN_IF_ERROR(
          detail::LceGradTile(tile, rows, cols, v0, V, tg, opt.ignore_index, opt.label_smoothing,
                              opt.z_loss, state, totals + 2, mean, dloss, S(ctx)),
          "LceGradTile");
      if (dh != nullptr) {  // dh[t0 rows] (= first tile, += later) tile @ W[v0 rows]
        absl::Status s = Gemm(ctx, GemmInput::kF32, false, false, rows, d, cols, 1.0f, tile, cols,
                              W + v0 * d, d, v0 == 0 ? 0.0f : 1.0f, dh + t0 * d, d);
        if (!s.ok()) return s;
      }
      if (dW != nullptr) {  // dW[v0 rows] += tile^T @ h[t0 rows]
        absl::Status s = Gemm(ctx, GemmInput::kF32, true, false, cols, d, rows, 1.0f, tile, cols,
                              h + t0 * d, d, 1.0f, dW + v0 * d, d);
        if (!s.ok()) return s;
      }
    }
  }
  double host[2] = {0, 0};
  int host_bad = 0;
  EMBER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host, totals, sizeof(host), cudaMemcpyDeviceToHost, S(ctx)), "readback");
  EMBER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&host_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, S(ctx)), "readback");
  if (absl::Status s = ctx.Synchronize(); !s.ok()) return s;
  if (host_bad != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FusedLinearCrossEntropy (CUDA): a target is outside [0, ", V, ") and not ignore_index ",
        opt.ignore_index, "; check the tokenizer's vocabulary size against the model's"));
  }
  LceResult r;
  r.num_valid = static_cast<int64_t>(host[1]);
  r.loss = r.num_valid == 0 ? 0.0 : (mean ? host[0] / r.num_valid : host[0]);
  return r;
}

}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
