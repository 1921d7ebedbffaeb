#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cast.h"
#include "kernels/gemm.h"
#include "kernels/tensor.h"
#include "kernels/vec.h"

namespace ember::kernels {
namespace {

// Calls fn(begin, end) over [0, n) split across the pool in ranges of at least `grain`.
template <typename Fn>
void For(const ExecContext& ctx, int64_t n, int64_t grain, Fn&& fn) {
  if (ctx.pool == nullptr) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  ctx.pool->ParallelFor(n, grain, fn);
}

// Column reduction: out[c] += sum_n f(n, c) for c in [0, C), each thread owning whole columns and
// summing rows in order, so the result is independent of the split.
template <typename RowFn>
void ColumnReduce(const ExecContext& ctx, int64_t N, int64_t C, float* out, RowFn row_fn) {
  For(ctx, C, 64, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) row_fn(n, c0, c1, out);
  });
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;

}  // namespace

void EmbeddingForward(const ExecContext& ctx, const int32_t* ids, int64_t N, const float* table,
                      int64_t C, float* out, bool accumulate) {
  For(ctx, N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* src = table + static_cast<int64_t>(ids[n]) * C;
      float* dst = out + n * C;
      if (accumulate) {
        for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
      } else {
        std::memcpy(dst, src, C * sizeof(float));
      }
    }
  });
}

void EmbeddingBackward(const ExecContext& ctx, const int32_t* ids, int64_t N, const float* dout,
                       int64_t C, float* dtable) {
  ColumnReduce(ctx, N, C, dtable, [&](int64_t n, int64_t c0, int64_t c1, float* dt) {
    float* dst = dt + static_cast<int64_t>(ids[n]) * C;
    const float* src = dout + n * C;
    for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
  });
}

void RmsNormForward(const ExecContext& ctx, const float* x, const float* w, int64_t N, int64_t C,
                    float eps, float* y, float* rstd) {
  For(ctx, N, 8, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* xr = x + n * C;
      float* yr = y + n * C;
      float r = 1.0f / std::sqrt(vec::Dot(xr, xr, C) / C + eps);
      rstd[n] = r;
      for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r * w[c];
    }
  });
}

void RmsNormBackward(const ExecContext& ctx, const float* x, const float* w, const float* rstd,
                     const float* dy, int64_t N, int64_t C, float* dx, float* dw) {
  For(ctx, N, 8, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* xr = x + n * C;
      const float* dyr = dy + n * C;
      float* dxr = dx + n * C;
      const float r = rstd[n];
      // dx = r * (g - x * r^2 * mean(g * x)), g = dy * w
      float acc[vec::kLanes] = {0};
      int64_t c = 0;
      for (; c + vec::kLanes <= C; c += vec::kLanes)
        for (int j = 0; j < vec::kLanes; ++j) acc[j] += dyr[c + j] * w[c + j] * xr[c + j];
      float gx = 0;
      for (int j = 0; j < vec::kLanes; ++j) gx += acc[j];
      for (; c < C; ++c) gx += dyr[c] * w[c] * xr[c];
      const float k = r * r * gx / C;
      for (c = 0; c < C; ++c) dxr[c] = r * (dyr[c] * w[c] - xr[c] * k);
    }
  });
  ColumnReduce(ctx, N, C, dw, [&](int64_t n, int64_t c0, int64_t c1, float* d) {
    const float* xr = x + n * C;
    const float* dyr = dy + n * C;
    const float r = rstd[n];
    for (int64_t c = c0; c < c1; ++c) d[c] += dyr[c] * xr[c] * r;
  });
}

namespace {

// n values rounded to bf16 (round to nearest even), for the bf16 linear GEMMs. A Tensor, so the
// buffer comes from the allocator's block cache (no zero fill, no fresh pages every call).
struct Bf16Buf {
  Tensor t;
  const uint16_t* data() const { return t.data<uint16_t>(); }
};
Bf16Buf Bf16Copy(const ExecContext& ctx, const float* x, int64_t n) {
  Bf16Buf b{Tensor::Empty(DType::kBF16, {n})};
  CastF32ToBf16(ctx, x, b.t.data<uint16_t>(), n);
  return b;
}

}  // namespace

void LinearForward(const ExecContext& ctx, const float* x, const float* W, const float* b,
                   int64_t N, int64_t in, int64_t out, float* y) {
  if (ctx.bf16_linear) {
    const auto xb = Bf16Copy(ctx, x, N * in), wb = Bf16Copy(ctx, W, out * in);
    GemmBf16(ctx, false, true, N, out, in, 1.0f, xb.data(), in, wb.data(), in, 0.0f, y, out);
  } else {
    Gemm(ctx, false, true, N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
  }
  if (b != nullptr) {
    For(ctx, N, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t n = r0; n < r1; ++n) vec::Axpy(1.0f, b, y + n * out, out);
    });
  }
}

void LinearBackward(const ExecContext& ctx, const float* x, const float* W, const float* dy,
                    int64_t N, int64_t in, int64_t out, float* dx, float* dW, float* db) {
  if (ctx.bf16_linear && (dx != nullptr || dW != nullptr)) {
    const auto dyb = Bf16Copy(ctx, dy, N * out);
    if (dx != nullptr) {
      const auto wb = Bf16Copy(ctx, W, out * in);
      GemmBf16(ctx, false, false, N, in, out, 1.0f, dyb.data(), out, wb.data(), in, 0.0f, dx, in);
    }
    if (dW != nullptr) {
      const auto xb = Bf16Copy(ctx, x, N * in);
      GemmBf16(ctx, true, false, out, in, N, 1.0f, dyb.data(), out, xb.data(), in, 1.0f, dW, in);
    }
  } else {
    if (dx != nullptr) Gemm(ctx, false, false, N, in, out, 1.0f, dy, out, W, in, 0.0f, dx, in);
    if (dW != nullptr) Gemm(ctx, true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
  }
  if (db != nullptr) {
    ColumnReduce(ctx, N, out, db, [&](int64_t n, int64_t c0, int64_t c1, float* d) {
      const float* g = dy + n * out;
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    });
  }
}

void GeluForward(const ExecContext& ctx, const float* x, float* y, int64_t n) {
  For(ctx, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float v = x[i];
      float u = kSqrt2OverPi * (v + 0.044715f * v * v * v);
      y[i] = 0.5f * v * (1.0f + vec::Tanh(u));
    }
  });
}

void GeluBackward(const ExecContext& ctx, const float* x, const float* dy, float* dx, int64_t n) {
  For(ctx, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float v = x[i];
      float u = kSqrt2OverPi * (v + 0.044715f * v * v * v);
      float t = vec::Tanh(u);
      float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
      dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
  });
}

void SwiGluForward(const ExecContext& ctx, const float* x, int64_t N, int64_t F, float* y) {
  For(ctx, N, 8, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* a = x + n * 2 * F;
      const float* g = a + F;
      float* yr = y + n * F;
      for (int64_t f = 0; f < F; ++f) {
        float s = 1.0f / (1.0f + vec::Exp(-a[f]));
        yr[f] = a[f] * s * g[f];
      }
    }
  });
}

void SwiGluBackward(const ExecContext& ctx, const float* x, const float* dy, int64_t N, int64_t F,
                    float* dx) {
  For(ctx, N, 8, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* a = x + n * 2 * F;
      const float* g = a + F;
      const float* dyr = dy + n * F;
      float* da = dx + n * 2 * F;
      float* dg = da + F;
      for (int64_t f = 0; f < F; ++f) {
        float s = 1.0f / (1.0f + vec::Exp(-a[f]));
        float silu = a[f] * s;
        dg[f] = dyr[f] * silu;
        da[f] = dyr[f] * g[f] * s * (1.0f + a[f] * (1.0f - s));
      }
    }
  });
}

void SoftmaxForward(const ExecContext& ctx, const float* x, int64_t N, int64_t C, float* y) {
  For(ctx, N, 4, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* xr = x + n * C;
      float* yr = y + n * C;
      const float m = vec::Max(xr, C);
      for (int64_t c = 0; c < C; ++c) yr[c] = vec::Exp(xr[c] - m);
      vec::Scale(1.0f / vec::Sum(yr, C), yr, C);
    }
  });
}

void SoftmaxBackward(const ExecContext& ctx, const float* y, const float* dy, int64_t N, int64_t C,
                     float* dx) {
  For(ctx, N, 4, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* yr = y + n * C;
      const float* dyr = dy + n * C;
      float* dxr = dx + n * C;
      const float s = vec::Dot(yr, dyr, C);
      for (int64_t c = 0; c < C; ++c) dxr[c] = yr[c] * (dyr[c] - s);
    }
  });
}

void Add(const ExecContext& ctx, const float* a, const float* b, float* out, int64_t n) {
  For(ctx, n, 1 << 15, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) out[i] = a[i] + b[i];
  });
}

void AddInPlace(const ExecContext& ctx, const float* x, float* y, int64_t n) {
  For(ctx, n, 1 << 15, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) y[i] += x[i];
  });
}

void AdamWStep(const ExecContext& ctx, const AdamWOptions& opt, int64_t step, float* param,
               const float* grad, float* m, float* v, int64_t n) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(opt.beta1, static_cast<double>(step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(opt.beta2, static_cast<double>(step)));
  const float decay = 1.0f - opt.lr * opt.weight_decay;
  const float step_size = opt.lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  // Values captured by copy and restrict pointers, so the stores cannot alias them and the loop
  // vectorises.
  const float beta1 = opt.beta1, beta2 = opt.beta2, eps = opt.eps;
  For(ctx, n, 1 << 14, [=](int64_t s, int64_t e) {
    float* __restrict p = param;
    const float* __restrict gr = grad;
    float* __restrict mm = m;
    float* __restrict vv = v;
    for (int64_t i = s; i < e; ++i) {
      float g = gr[i];
      float mi = beta1 * mm[i] + (1.0f - beta1) * g;
      float vi = beta2 * vv[i] + (1.0f - beta2) * g * g;
      mm[i] = mi;
      vv[i] = vi;
      float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
      p[i] = p[i] * decay - step_size * mi / denom;
    }
  });
}

double GlobalL2Norm(const ExecContext& ctx,
                    const std::vector<std::pair<const float*, int64_t>>& ts) {
  constexpr int64_t kChunk = 1 << 14;
  // Flatten (tensor, chunk) pairs; each chunk's sum is computed independently, then added in order.
  std::vector<std::pair<const float*, int64_t>> chunks;
  for (const auto& [p, n] : ts)
    for (int64_t o = 0; o < n; o += kChunk) chunks.emplace_back(p + o, std::min(kChunk, n - o));
  std::vector<double> partial(chunks.size());
  For(ctx, chunks.size(), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* p = chunks[i].first;
      int64_t n = chunks[i].second;
      double acc[8] = {0};
      int64_t j = 0;
      for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(p[j + k]) * p[j + k];
      double s = 0;
      for (int k = 0; k < 8; ++k) s += acc[k];
      for (; j < n; ++j) s += static_cast<double>(p[j]) * p[j];
      partial[i] = s;
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  return std::sqrt(total);
}

double ClipGradNorm(const ExecContext& ctx, const std::vector<std::pair<float*, int64_t>>& ts,
                    double max_norm) {
  std::vector<std::pair<const float*, int64_t>> cts(ts.begin(), ts.end());
  const double norm = GlobalL2Norm(ctx, cts);
  if (norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    for (const auto& [p, n] : ts) {
      float* q = p;
      For(ctx, n, 1 << 15, [&](int64_t s, int64_t e) { vec::Scale(scale, q + s, e - s); });
    }
  }
  return norm;
}

}  // namespace ember::kernels
