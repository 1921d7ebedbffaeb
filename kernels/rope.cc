#include "kernels/rope.h"

#include <cmath>

namespace ember::kernels {
namespace {

// Rows [r0, r1). sign = +1: forward rotation; -1: inverse. Built without FMA contraction (the
// kernels' copts have -ffp-contract=fast): each product rounds on its own, so the result is
// bitwise PyTorch's q*cos + rotate_half(q)*sin on the same cos/sin.
__attribute__((optimize("fp-contract=off"))) void RotateRows(const RopeTable& tb, float* x,
                                                             int64_t r0, int64_t r1, int64_t T,
                                                             int64_t heads, int64_t hd,
                                                             int64_t stride, float sign) {
  const int64_t half = hd / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t t = r % T;
    const float* __restrict c = tb.cos.data() + t * half;
    const float* __restrict s = tb.sin.data() + t * half;
    float* row = x + r * stride;
    for (int64_t h = 0; h < heads; ++h) {
      float* __restrict p = row + h * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = p[2 * i], x1 = p[2 * i + 1], si = sign * s[i];
        p[2 * i] = x0 * c[i] - x1 * si;
        p[2 * i + 1] = x0 * si + x1 * c[i];
      }
    }
  }
}

void Rotate(const ExecContext& ctx, const RopeTable& tb, float* x, int64_t B, int64_t T,
            int64_t heads, int64_t hd, int64_t stride, float sign) {
  const int64_t rows = B * T;
  if (ctx.pool == nullptr) {
    RotateRows(tb, x, 0, rows, T, heads, hd, stride, sign);
    return;
  }
  ctx.pool->ParallelFor(rows, 16, [&](int64_t r0, int64_t r1) {
    RotateRows(tb, x, r0, r1, T, heads, hd, stride, sign);
  });
}

}  // namespace

std::vector<float> RopeInvFreq(int64_t hd, float theta, const RopeScaling& sc) {
  const int64_t half = hd / 2;
  std::vector<float> inv(half);
  // torch: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), all float32.
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(hd);
    inv[i] = 1.0f / std::pow(theta, e);
  }
  if (!sc.llama3) return inv;
  // transformers' _compute_llama3_parameters, scalars rounded to float32 as torch does.
  const float factor = sc.factor, lo = sc.low_freq_factor, hi = sc.high_freq_factor;
  const float old_ctx = static_cast<float>(sc.original_max_position);
  const float low_freq_wavelen = static_cast<float>(double(sc.original_max_position) / lo);
  const float high_freq_wavelen = static_cast<float>(double(sc.original_max_position) / hi);
  const float two_pi = static_cast<float>(2 * M_PI);
  for (int64_t i = 0; i < half; ++i) {
    const float f = inv[i];
    const float wavelen = two_pi / f;
    float out = wavelen > low_freq_wavelen ? f / factor : f;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const float smooth = (old_ctx / wavelen - lo) / (hi - lo);
      out = (1.0f - smooth) * out / factor + smooth * out;
    }
    inv[i] = out;
  }
  return inv;
}

RopeTable MakeRopeTable(const std::vector<float>& inv_freq, int64_t T) {
  RopeTable tb;
  tb.T = T;
  tb.half = static_cast<int64_t>(inv_freq.size());
  tb.cos.resize(T * tb.half);
  tb.sin.resize(T * tb.half);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < tb.half; ++i) {
      const float angle = static_cast<float>(t) * inv_freq[i];
      tb.cos[t * tb.half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      tb.sin[t * tb.half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return tb;
}

void RopeForward(const ExecContext& ctx, const RopeTable& table, float* x, int64_t B, int64_t T,
                 int64_t heads, int64_t hd, int64_t stride) {
  Rotate(ctx, table, x, B, T, heads, hd, stride, 1.0f);
}

void RopeBackward(const ExecContext& ctx, const RopeTable& table, float* dx, int64_t B,
                  int64_t T, int64_t heads, int64_t hd, int64_t stride) {
  Rotate(ctx, table, dx, B, T, heads, hd, stride, -1.0f);
}

}  // namespace ember::kernels
