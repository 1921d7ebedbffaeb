#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cast.h"
#include "kernels/gemm.h"
#include "kernels/tensor.h"
#include "kernels/vec.h"

namespace ember::kernels {
namespace {

template <typename Fn>
void For(const ExecContext& ctx, int64_t n, int64_t grain, Fn&& fn) {
  if (ctx.pool == nullptr) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  ctx.pool->ParallelFor(n, grain, fn);
}

absl::Status CollectValid(const LceOptions& opt, const int32_t* targets, int64_t N, int64_t V,
                          std::vector<int64_t>* valid) {
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == opt.ignore_index) continue;
    if (targets[n] < 0 || targets[n] >= V) {
      return absl::InvalidArgumentError(
          absl::StrCat("target ", targets[n], " at position ", n, " outside [0, ", V, ")"));
    }
    valid->push_back(n);
  }
  return absl::OkStatus();
}

// Per-row statistics of one chunk: running max, sum of exp(z - max), sum of z, target logit.
struct RowStats {
  float m, s, sum_z, z_y;
};

// Turns finished stats into the row loss; when `grad` is non-null, overwrites the logits row z
// (length V) with coef * dloss/dz.
double FinishRow(const LceOptions& opt, const RowStats& st, int32_t y, int64_t V, float coef,
                 float* z, bool grad) {
  const float lse = st.m + std::log(st.s);
  const float eps = opt.label_smoothing;
  double loss = static_cast<double>(lse) - (1.0 - eps) * st.z_y - (eps / V) * st.sum_z +
                static_cast<double>(opt.z_loss) * lse * lse;
  if (grad) {
    const float pscale = coef * (1.0f + 2.0f * opt.z_loss * lse);
    const float shift = coef * eps / V;
    for (int64_t j = 0; j < V; ++j) z[j] = vec::Exp(z[j] - lse) * pscale - shift;
    z[y] -= coef * (1.0f - eps);
  }
  return loss;
}

// Folds logits z[0, len) into the running stats.
void Accumulate(const float* z, int64_t len, RowStats* st) {
  const float bm = vec::Max(z, len);
  const float m = std::max(st->m, bm);
  float acc[vec::kLanes] = {0};
  int64_t j = 0;
  for (; j + vec::kLanes <= len; j += vec::kLanes)
    for (int k = 0; k < vec::kLanes; ++k) acc[k] += vec::Exp(z[j + k] - m);
  float s = 0;
  for (int k = 0; k < vec::kLanes; ++k) s += acc[k];
  for (; j < len; ++j) s += vec::Exp(z[j] - m);
  st->s = st->s * vec::Exp(st->m - m) + s;
  st->m = m;
  st->sum_z += vec::Sum(z, len);
}

// C[M,N] = A[M,K] @ B[K,N] (row-major; lda = row stride of A, B and C dense) with K split into
// kSplitK fixed parts (from the shape only, so deterministic for any pool size), one
// single-threaded sgemm per part, summed in part order. For the dh product, whose K (the
// vocabulary) dwarfs M and N: splitting the output instead would pack the whole logits chunk
// once per output tile. parts holds (kSplitK - 1) * M * N floats.
constexpr int64_t kSplitK = 4;

void GemmSplitK(const ExecContext& ctx, int64_t M, int64_t N, int64_t K, const float* A,
                int64_t lda, const float* B, float* C, float* parts) {
  const int64_t kp = (K + kSplitK - 1) / kSplitK;
  const ExecContext one{nullptr, true};  // each part runs on one thread
  auto part = [&](int64_t p) {
    const int64_t k0 = std::min(K, p * kp), k1 = std::min(K, k0 + kp);
    float* out = p == 0 ? C : parts + (p - 1) * M * N;
    if (k1 > k0) {
      Gemm(one, false, false, M, N, k1 - k0, 1.0f, A + k0, lda, B + k0 * N, N, 0.0f, out, N);
    } else {
      std::memset(out, 0, M * N * sizeof(float));
    }
  };
  if (ctx.pool) ctx.pool->Run(kSplitK, part); else for (int64_t p = 0; p < kSplitK; ++p) part(p);
  For(ctx, M * N, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t p = 1; p < kSplitK; ++p) {
      const float* src = parts + (p - 1) * M * N;
      for (int64_t i = b; i < e; ++i) C[i] += src[i];
    }
  });
}

// GemmSplitK with bf16 A and B (ExecContext::bf16_linear): the same fixed parts, each one
// single-threaded GemmBf16.
void GemmSplitKBf16(const ExecContext& ctx, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                    int64_t lda, const uint16_t* B, float* C, float* parts) {
  const int64_t kp = (K + kSplitK - 1) / kSplitK;
  const ExecContext one{nullptr, true};
  auto part = [&](int64_t p) {
    const int64_t k0 = std::min(K, p * kp), k1 = std::min(K, k0 + kp);
    float* out = p == 0 ? C : parts + (p - 1) * M * N;
    if (k1 > k0) {
      GemmBf16(one, false, false, M, N, k1 - k0, 1.0f, A + k0, lda, B + k0 * N, N, 0.0f, out, N);
    } else {
      std::memset(out, 0, M * N * sizeof(float));
    }
  };
  if (ctx.pool) ctx.pool->Run(kSplitK, part); else for (int64_t p = 0; p < kSplitK; ++p) part(p);
  For(ctx, M * N, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t p = 1; p < kSplitK; ++p) {
      const float* src = parts + (p - 1) * M * N;
      for (int64_t i = b; i < e; ++i) C[i] += src[i];
    }
  });
}

struct Common {
  std::vector<int64_t> valid;
  float coef = 0;  // dloss / count (mean) or dloss (sum)
};

absl::StatusOr<Common> Prepare(const LceOptions& opt, const int32_t* targets, int64_t N, int64_t V,
                               float dloss) {
  Common c;
  if (auto st = CollectValid(opt, targets, N, V, &c.valid); !st.ok()) return st;
  c.coef = dloss;
  if (opt.reduction == LceOptions::Reduction::kMean && !c.valid.empty())
    c.coef = dloss / static_cast<float>(c.valid.size());
  return c;
}

}  // namespace

absl::StatusOr<LceResult> FusedLinearCrossEntropy(const ExecContext& ctx, const LceOptions& opt,
                                                  const float* h, const float* W,
                                                  const int32_t* targets, int64_t N, int64_t d,
                                                  int64_t V, float* dh, float* dW, float dloss) {
  auto common_or = Prepare(opt, targets, N, V, dloss);
  if (!common_or.ok()) return common_or.status();
  const Common& c = *common_or;
  const bool grad = dh != nullptr || dW != nullptr;
  const int64_t nv = c.valid.size();
  if (dh != nullptr) std::memset(dh, 0, N * d * sizeof(float));
  int64_t chunk = opt.token_chunk;
  if (chunk <= 0) chunk = std::max<int64_t>(64, ((int64_t{56} << 20) / V) / 64 * 64);
  chunk = std::min(chunk, std::max<int64_t>(nv, 1));
  const int64_t vc = std::max<int64_t>(1, std::min(opt.vocab_chunk, V));

  Tensor logits = Tensor::Empty(DType::kF32, {chunk, V});
  Tensor hc = Tensor::Empty(DType::kF32, {chunk, d});
  Tensor dhc = grad ? Tensor::Empty(DType::kF32, {chunk, d}) : Tensor();
  Tensor dh_parts =
      dh != nullptr ? Tensor::Empty(DType::kF32, {kSplitK - 1, chunk, d}) : Tensor();
  std::vector<RowStats> stats(chunk);
  std::vector<double> row_loss(nv);
  float* L = logits.data<float>();
  float* H = hc.data<float>();
  // bf16_linear: the three head GEMMs take bf16 inputs (W, the chunk's h and, backward, its
  // logit gradients), fp32 accumulation; the log-sum-exp and the gradient formula stay fp32.
  const bool bf16 = ctx.bf16_linear;
  Tensor wb = bf16 ? Tensor::Empty(DType::kBF16, {V, d}) : Tensor();
  Tensor hb = bf16 ? Tensor::Empty(DType::kBF16, {chunk, d}) : Tensor();
  Tensor lb = bf16 && grad ? Tensor::Empty(DType::kBF16, {chunk, V}) : Tensor();
  if (bf16) CastF32ToBf16(ctx, W, wb.data<uint16_t>(), V * d);

  for (int64_t c0 = 0; c0 < nv; c0 += chunk) {
    const int64_t n = std::min(chunk, nv - c0);
    For(ctx, n, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        std::memcpy(H + r * d, h + c.valid[c0 + r] * d, d * sizeof(float));
        stats[r] = RowStats{-INFINITY, 0.0f, 0.0f, 0.0f};
      }
    });
    // One GEMM over the whole vocabulary (the output is split over the pool inside Gemm); the
    // online log-sum-exp then walks the vocab tiles of each row.
    if (bf16) {
      CastF32ToBf16(ctx, H, hb.data<uint16_t>(), n * d);
      GemmBf16(ctx, false, true, n, V, d, 1.0f, hb.data<uint16_t>(), d, wb.data<uint16_t>(), d,
               0.0f, L, V);
    } else {
      Gemm(ctx, false, true, n, V, d, 1.0f, H, d, W, d, 0.0f, L, V);
    }
    for (int64_t v0 = 0; v0 < V; v0 += vc) {
      const int64_t len = std::min(vc, V - v0);
      For(ctx, n, 4, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const float* z = L + r * V + v0;
          Accumulate(z, len, &stats[r]);
          const int32_t y = targets[c.valid[c0 + r]];
          if (y >= v0 && y < v0 + len) stats[r].z_y = z[y - v0];
        }
      });
    }
    For(ctx, n, 4, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        row_loss[c0 + r] = FinishRow(opt, stats[r], targets[c.valid[c0 + r]], V, c.coef,
                                     L + r * V, grad);
      }
    });
    if (!grad) continue;
    if (bf16) CastF32ToBf16(ctx, L, lb.data<uint16_t>(), n * V);
    if (dh != nullptr) {
      float* DH = dhc.data<float>();
      if (bf16) {
        GemmSplitKBf16(ctx, n, d, V, lb.data<uint16_t>(), V, wb.data<uint16_t>(), DH,
                       dh_parts.data<float>());
      } else {
        GemmSplitK(ctx, n, d, V, L, V, W, DH, dh_parts.data<float>());
      }
      For(ctx, n, 16, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          std::memcpy(dh + c.valid[c0 + r] * d, DH + r * d, d * sizeof(float));
      });
    }
    if (dW != nullptr) {
      if (bf16) {
        GemmBf16(ctx, true, false, V, d, n, 1.0f, lb.data<uint16_t>(), V, hb.data<uint16_t>(), d,
                 1.0f, dW, d);
      } else {
        Gemm(ctx, true, false, V, d, n, 1.0f, L, V, H, d, 1.0f, dW, d);
      }
    }
  }

  LceResult res;
  res.num_valid = nv;
  for (double l : row_loss) res.loss += l;
  if (opt.reduction == LceOptions::Reduction::kMean && nv > 0) res.loss /= nv;
  return res;
}

absl::StatusOr<LceResult> MaterialisedLinearCrossEntropy(const ExecContext& ctx,
                                                         const LceOptions& opt, const float* h,
                                                         const float* W, const int32_t* targets,
                                                         int64_t N, int64_t d, int64_t V,
                                                         float* dh, float* dW, float dloss) {
  auto common_or = Prepare(opt, targets, N, V, dloss);
  if (!common_or.ok()) return common_or.status();
  const Common& c = *common_or;
  const bool grad = dh != nullptr || dW != nullptr;
  Tensor logits = Tensor::Empty(DType::kF32, {N, V});
  float* L = logits.data<float>();
  Gemm(ctx, false, true, N, V, d, 1.0f, h, d, W, d, 0.0f, L, V);
  std::vector<double> row_loss(N, 0.0);
  For(ctx, N, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* z = L + r * V;
      const int32_t y = targets[r];
      if (y == opt.ignore_index) {
        std::memset(z, 0, V * sizeof(float));
        continue;
      }
      RowStats st{-INFINITY, 0.0f, 0.0f, z[y]};
      Accumulate(z, V, &st);
      row_loss[r] = FinishRow(opt, st, y, V, c.coef, z, grad);
    }
  });
  if (dh != nullptr) Gemm(ctx, false, false, N, d, V, 1.0f, L, V, W, d, 0.0f, dh, d);
  if (dW != nullptr) Gemm(ctx, true, false, V, d, N, 1.0f, L, V, h, d, 1.0f, dW, d);
  LceResult res;
  res.num_valid = c.valid.size();
  for (double l : row_loss) res.loss += l;
  if (opt.reduction == LceOptions::Reduction::kMean && res.num_valid > 0) res.loss /= res.num_valid;
  return res;
}

}  // namespace ember::kernels
