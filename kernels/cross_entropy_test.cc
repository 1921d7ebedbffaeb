// Fused linear cross-entropy vs the materialised-logits version (fp32, 1e-5 relative) and a float64
// reference, across label smoothing, z-loss, ignore_index, reductions and tied-weight accumulation.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "kernels/cast.h"
#include "kernels/cross_entropy.h"
#include "testing/kernel_test_util.h"

namespace ember::kernels {
namespace {

using testing::ErrRatio;
using testing::Random;
using V = std::vector<double>;

// float64 loss and gradients.
double RefLce(const LceOptions& o, const V& h, const V& W, const std::vector<int32_t>& y,
              int64_t N, int64_t d, int64_t Vn, V* dh, V* dW) {
  dh->assign(N * d, 0.0);
  dW->assign(Vn * d, 0.0);
  int64_t count = 0;
  for (int32_t t : y) count += t != o.ignore_index;
  const double coef = o.reduction == LceOptions::Reduction::kMean ? 1.0 / std::max<int64_t>(1, count) : 1.0;
  double loss = 0;
  const double eps = o.label_smoothing;
  for (int64_t n = 0; n < N; ++n) {
    if (y[n] == o.ignore_index) continue;
    V z(Vn);
    double m = -1e300, sz = 0, s = 0;
    for (int64_t j = 0; j < Vn; ++j) {
      for (int64_t k = 0; k < d; ++k) z[j] += h[n * d + k] * W[j * d + k];
      m = std::max(m, z[j]);
      sz += z[j];
    }
    for (int64_t j = 0; j < Vn; ++j) s += std::exp(z[j] - m);
    const double lse = m + std::log(s);
    loss += coef * (lse - (1 - eps) * z[y[n]] - eps / Vn * sz + o.z_loss * lse * lse);
    for (int64_t j = 0; j < Vn; ++j) {
      double g = coef * (std::exp(z[j] - lse) * (1 + 2 * o.z_loss * lse) - eps / Vn -
                         (j == y[n] ? 1 - eps : 0));
      for (int64_t k = 0; k < d; ++k) {
        (*dh)[n * d + k] += g * W[j * d + k];
        (*dW)[j * d + k] += g * h[n * d + k];
      }
    }
  }
  return loss;
}

TEST_CASE("Fused LCE equals materialised logits and the float64 reference") {
  ThreadPool pool(2);
  ExecContext ctx{&pool, true};
  const int64_t N = 150, d = 24, Vn = 333;
  auto h = Random(N * d, 1), W = Random(Vn * d, 2, 0.5f);
  std::vector<int32_t> y(N);
  for (int64_t n = 0; n < N; ++n) y[n] = (n * 37 + 11) % Vn;
  for (int64_t n = 0; n < N; n += 7) y[n] = -100;  // ignored
  struct Case { float ls, zl; LceOptions::Reduction red; };
  for (Case cs : {Case{0, 0, LceOptions::Reduction::kMean}, Case{0.1f, 0, LceOptions::Reduction::kMean},
                  Case{0, 1e-3f, LceOptions::Reduction::kSum}, Case{0.2f, 1e-2f, LceOptions::Reduction::kSum}}) {
    LceOptions o;
    o.label_smoothing = cs.ls;
    o.z_loss = cs.zl;
    o.reduction = cs.red;
    o.token_chunk = 64;  // several token chunks
    o.vocab_chunk = 100; // and vocab tiles with a ragged last one
    INFO("label_smoothing " << cs.ls << " z_loss " << cs.zl);
    std::vector<float> dh_f(N * d), dW_f(Vn * d, 0.f), dh_m(N * d), dW_m(Vn * d, 0.f);
    auto rf = FusedLinearCrossEntropy(ctx, o, h.data(), W.data(), y.data(), N, d, Vn, dh_f.data(), dW_f.data());
    auto rm = MaterialisedLinearCrossEntropy(ctx, o, h.data(), W.data(), y.data(), N, d, Vn, dh_m.data(), dW_m.data());
    REQUIRE(rf.ok());
    REQUIRE(rm.ok());
    CHECK(rf->num_valid == N - (N + 6) / 7);
    CHECK(std::fabs(rf->loss - rm->loss) <= 1e-5 * std::fabs(rm->loss));
    CHECK(ErrRatio(dh_f, dh_m, 1e-5) <= 1);
    CHECK(ErrRatio(dW_f, dW_m, 1e-5) <= 1);
    V dh_r, dW_r;
    double lr = RefLce(o, V(h.begin(), h.end()), V(W.begin(), W.end()), y, N, d, Vn, &dh_r, &dW_r);
    CHECK(std::fabs(rf->loss - lr) <= 1e-5 * std::fabs(lr));
    CHECK(ErrRatio(dh_f, dh_r, 1e-5) <= 1);
    CHECK(ErrRatio(dW_f, dW_r, 1e-5) <= 1);
    for (int64_t n = 0; n < N; n += 7)
      for (int64_t k = 0; k < d; ++k) CHECK(dh_f[n * d + k] == 0.0f);
    // Loss only gives the same loss.
    auto rl = FusedLinearCrossEntropy(ctx, o, h.data(), W.data(), y.data(), N, d, Vn, nullptr, nullptr);
    CHECK(rl->loss == rf->loss);
  }
}

// bf16 of a double (through float, round to nearest even), as a double.
double Bf16(double x) { return Bf16ToF32(F32ToBf16(static_cast<float>(x))); }

TEST_CASE("Fused LCE with bf16_linear: bf16 GEMM inputs against a float64 reference") {
  ThreadPool pool(2);
  ExecContext ctx{&pool, true};
  ctx.bf16_linear = true;
  const int64_t N = 150, d = 40, Vn = 333;
  auto h = Random(N * d, 5), W = Random(Vn * d, 6, 0.5f);
  std::vector<int32_t> y(N);
  for (int64_t n = 0; n < N; ++n) y[n] = (n * 41 + 3) % Vn;
  for (int64_t n = 0; n < N; n += 9) y[n] = -100;
  LceOptions o;
  o.token_chunk = 64;
  o.vocab_chunk = 100;
  std::vector<float> dh(N * d), dW(Vn * d, 0.f);
  auto r = FusedLinearCrossEntropy(ctx, o, h.data(), W.data(), y.data(), N, d, Vn, dh.data(), dW.data());
  REQUIRE(r.ok());
  // Reference: logits from bf16(h), bf16(W) in float64; gradients from bf16(g) with those inputs.
  V hr(N * d), Wr(Vn * d), dh_r(N * d, 0.0), dW_r(Vn * d, 0.0);
  for (int64_t i = 0; i < N * d; ++i) hr[i] = Bf16(h[i]);
  for (int64_t i = 0; i < Vn * d; ++i) Wr[i] = Bf16(W[i]);
  int64_t count = 0;
  for (int32_t t : y) count += t != o.ignore_index;
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (y[n] == o.ignore_index) continue;
    V z(Vn, 0.0);
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < Vn; ++j) {
      for (int64_t k = 0; k < d; ++k) z[j] += hr[n * d + k] * Wr[j * d + k];
      m = std::max(m, z[j]);
    }
    for (int64_t j = 0; j < Vn; ++j) s += std::exp(z[j] - m);
    const double lse = m + std::log(s);
    loss += (lse - z[y[n]]) / count;
    for (int64_t j = 0; j < Vn; ++j) {
      const double g = Bf16((std::exp(z[j] - lse) - (j == y[n] ? 1 : 0)) / count);
      for (int64_t k = 0; k < d; ++k) {
        dh_r[n * d + k] += g * Wr[j * d + k];
        dW_r[j * d + k] += g * hr[n * d + k];
      }
    }
  }
  // Logits accumulate in fp32 (1e-5); the gradients also carry the rare element whose fp32
  // gradient rounds to the other bf16 neighbour than the float64 one (2^-8 of one term): 1e-4 of
  // the largest entry (seen: 4e-7).
  CHECK(std::fabs(r->loss - loss) <= 1e-5 * std::fabs(loss));
  CHECK(ErrRatio(dh, dh_r, 1e-4) <= 1);
  CHECK(ErrRatio(dW, dW_r, 1e-4) <= 1);
  // The inputs really were rounded: the fp32 fused result is measurably different.
  ExecContext f32 = ctx;
  f32.bf16_linear = false;
  std::vector<float> dh32(N * d), dW32(Vn * d, 0.f);
  auto r32 = FusedLinearCrossEntropy(f32, o, h.data(), W.data(), y.data(), N, d, Vn, dh32.data(), dW32.data());
  REQUIRE(r32.ok());
  INFO("fp32 loss " << r32->loss << " bf16 loss " << r->loss << " ref " << loss);
  CHECK(std::fabs(r32->loss - loss) > 1e-5 * std::fabs(loss));
  CHECK(ErrRatio(dW32, dW_r, 1e-4) > 10);
}

TEST_CASE("Fused LCE accumulates into a tied weight gradient and validates targets") {
  ThreadPool pool(2);
  ExecContext ctx{&pool, true};
  const int64_t N = 20, d = 8, Vn = 50;
  auto h = Random(N * d, 3), W = Random(Vn * d, 4);
  std::vector<int32_t> y(N, 3);
  std::vector<float> dh(N * d), dW(Vn * d, 0.f), dW2(Vn * d, 1.0f);
  LceOptions o;
  REQUIRE(FusedLinearCrossEntropy(ctx, o, h.data(), W.data(), y.data(), N, d, Vn, dh.data(), dW.data()).ok());
  REQUIRE(FusedLinearCrossEntropy(ctx, o, h.data(), W.data(), y.data(), N, d, Vn, dh.data(), dW2.data()).ok());
  for (int64_t i = 0; i < Vn * d; ++i) REQUIRE(dW2[i] == Approx(dW[i] + 1.0f).margin(1e-6));
  y[5] = 50;
  auto bad = FusedLinearCrossEntropy(ctx, o, h.data(), W.data(), y.data(), N, d, Vn, dh.data(), dW.data());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Fused LCE is bitwise deterministic across pool sizes") {
  const int64_t N = 300, d = 40, Vn = 1000;
  auto h = Random(N * d, 5), W = Random(Vn * d, 6);
  std::vector<int32_t> y(N);
  for (int64_t n = 0; n < N; ++n) y[n] = (n * 13) % Vn;
  LceOptions o;
  o.label_smoothing = 0.1f;
  o.token_chunk = 128;
  auto run = [&](int threads) {
    ThreadPool pool(threads);
    ExecContext ctx{&pool, true};
    std::vector<float> dh(N * d), dW(Vn * d, 0.f);
    double loss = FusedLinearCrossEntropy(ctx, o, h.data(), W.data(), y.data(), N, d, Vn, dh.data(), dW.data())->loss;
    dh.insert(dh.end(), dW.begin(), dW.end());
    dh.push_back(static_cast<float>(loss));
    return dh;
  };
  auto a = run(1), b = run(2), c = run(3), a2 = run(1);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  CHECK(std::memcmp(a.data(), c.data(), a.size() * 4) == 0);
  CHECK(std::memcmp(a.data(), a2.data(), a.size() * 4) == 0);
}

}  // namespace
}  // namespace ember::kernels
