// RoPE: frequencies against values printed by PyTorch (Hugging Face's formulas), rotation and its
// gradient against a float64 reference and float64 finite differences; determinism over pools.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/rope.h"
#include "testing/kernel_test_util.h"

namespace ember::kernels {
namespace {

using testing::ErrRatio;
using testing::NumericGrad;
using testing::Random;
using testing::ToDouble;
using testing::WeightedSum;
using V = std::vector<double>;

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
int64_t UlpDiff(float a, float b) {
  int32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return std::llabs(int64_t{x} - int64_t{y});
}

// Printed by /usr/bin/python3 (torch 2.x) with transformers' _compute_default_rope_parameters and
// _compute_llama3_parameters copied verbatim (theta 10000, hd 16; llama3: factor 4, low 1, high 4,
// original context 64, which puts frequencies in all three bands).
const uint32_t kDefault16[] = {0x3f800000, 0x3ea1e89b, 0x3dcccccd, 0x3d0186e3,
                               0x3c23d70a, 0x3b4f3e38, 0x3a83126f, 0x39a5cb60};
const uint32_t kLlama3_16[] = {0x3f800000, 0x3e826136, 0x3cd09b89, 0x3c0186e3,
                               0x3b23d70a, 0x3a4f3e38, 0x3983126f, 0x38a5cb60};
// Llama 3.1 8B: theta 500000, hd 128, factor 8, low 1, high 4, original 8192 (indices 28..36
// cover the smoothed band).
const uint32_t kLlama31_28[] = {0x3b527720, 0x3b0dfd06, 0x3ab3d11d, 0x3a60979e, 0x3a0995d2,
                                0x39a3f108, 0x393b2dd2, 0x38c86886, 0x38a3418d};

TEST_CASE("RoPE frequencies match Hugging Face's float32 formulas") {
  auto d = RopeInvFreq(16, 10000.0f, {});
  REQUIRE(d.size() == 8);
  for (int i = 0; i < 8; ++i) CHECK(UlpDiff(d[i], FromBits(kDefault16[i])) <= 1);
  RopeScaling sc;
  sc.llama3 = true;
  sc.factor = 4;
  sc.original_max_position = 64;
  auto s = RopeInvFreq(16, 10000.0f, sc);
  for (int i = 0; i < 8; ++i) CHECK(UlpDiff(s[i], FromBits(kLlama3_16[i])) <= 2);
  RopeScaling l31;
  l31.llama3 = true;
  auto big = RopeInvFreq(128, 500000.0f, l31);
  for (int i = 0; i < 9; ++i) CHECK(UlpDiff(big[28 + i], FromBits(kLlama31_28[i])) <= 2);
}

// Float64 reference on rows [B,T] of `heads` heads (stride = heads*hd + pad).
V RefRope(const V& x, const RopeTable& tb, int64_t B, int64_t T, int64_t heads, int64_t hd,
          int64_t stride) {
  V y = x;
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const int64_t t = r % T, o = r * stride + h * hd + 2 * i;
        const double c = tb.cos[t * tb.half + i], s = tb.sin[t * tb.half + i];
        y[o] = x[o] * c - x[o + 1] * s;
        y[o + 1] = x[o] * s + x[o + 1] * c;
      }
  return y;
}

TEST_CASE("RoPE forward and backward match float64 references") {
  const int64_t B = 2, T = 7, heads = 3, hd = 8, stride = heads * hd + 5;  // padding untouched
  const auto tb = MakeRopeTable(RopeInvFreq(hd, 10000.0f, {}), T);
  // The table holds cos/sin of float32(t * inv_freq).
  const auto inv = RopeInvFreq(hd, 10000.0f, {});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double a = static_cast<float>(t) * inv[i];
      CHECK(std::fabs(tb.cos[t * 4 + i] - std::cos(a)) <= 6e-8);
      CHECK(std::fabs(tb.sin[t * 4 + i] - std::sin(a)) <= 6e-8);
    }
  auto x = Random(B * T * stride, 11);
  auto dy = Random(B * T * stride, 12);
  ThreadPool pool(3);
  ExecContext ctx{&pool, true};
  std::vector<float> y = x;
  RopeForward(ctx, tb, y.data(), B, T, heads, hd, stride);
  const V yref = RefRope(ToDouble(x), tb, B, T, heads, hd, stride);
  CHECK(ErrRatio(y, yref, 1e-6) <= 1);
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t c = heads * hd; c < stride; ++c) CHECK(y[r * stride + c] == x[r * stride + c]);
  // Gradient of sum(dy * rope(x)) w.r.t. x, by float64 central differences.
  const V num = NumericGrad(
      [&](const V& xv) { return WeightedSum(RefRope(xv, tb, B, T, heads, hd, stride), ToDouble(dy)); },
      ToDouble(x));
  std::vector<float> dx = dy;
  RopeBackward(ctx, tb, dx.data(), B, T, heads, hd, stride);
  CHECK(ErrRatio(dx, num, 1e-6) <= 1);
  // Bitwise: each product rounded on its own (no FMA), as PyTorch's q*cos + rotate_half(q)*sin.
  // (This test is built without -mfma, so these float expressions are not contracted either.)
  std::vector<float> want = x, want_dx = dy;
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const int64_t t = r % T, o = r * stride + h * hd + 2 * i;
        const float c = tb.cos[t * 4 + i], s = tb.sin[t * 4 + i];
        const float p0 = x[o] * c, p1 = x[o + 1] * s, p2 = x[o] * s, p3 = x[o + 1] * c;
        want[o] = p0 - p1;
        want[o + 1] = p2 + p3;
        const float g0 = dy[o] * c, g1 = dy[o + 1] * s, g2 = dy[o] * s, g3 = dy[o + 1] * c;
        want_dx[o] = g0 + g1;
        want_dx[o + 1] = g3 - g2;
      }
  CHECK(std::memcmp(y.data(), want.data(), y.size() * 4) == 0);
  CHECK(std::memcmp(dx.data(), want_dx.data(), dx.size() * 4) == 0);
  // Backward undoes forward (rotation is orthogonal).
  std::vector<float> back = y;
  RopeBackward(ExecContext{}, tb, back.data(), B, T, heads, hd, stride);
  CHECK(ErrRatio(back, ToDouble(x), 1e-6) <= 1);
}

TEST_CASE("RoPE with llama3 scaling and a long table rotates position 0 not at all") {
  RopeScaling sc;
  sc.llama3 = true;
  const auto tb = MakeRopeTable(RopeInvFreq(64, 500000.0f, sc), 300);
  auto x = Random(2 * 300 * 64, 13);
  std::vector<float> a = x, b = x;
  ThreadPool p1(1), p4(4);
  RopeForward(ExecContext{&p1, true}, tb, a.data(), 2, 300, 1, 64, 64);
  RopeForward(ExecContext{&p4, true}, tb, b.data(), 2, 300, 1, 64, 64);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  for (int64_t c = 0; c < 64; ++c) CHECK(a[c] == x[c]);  // t = 0 of batch 0
  CHECK(ErrRatio(a, RefRope(ToDouble(x), tb, 2, 300, 1, 64, 64), 1e-6) <= 1);
}

}  // namespace
}  // namespace ember::kernels
