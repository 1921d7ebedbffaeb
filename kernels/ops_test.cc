// Forward/backward of the elementwise, norm, embedding, linear and optimiser kernels against
// float64 references (finite differences of a float64 forward), casts against F16C hardware.
#include <immintrin.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "kernels/cast.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "testing/kernel_test_util.h"

namespace ember::kernels {
namespace {

using testing::ErrRatio;
using testing::NumericGrad;
using testing::Random;
using testing::ToDouble;
using testing::WeightedSum;
using V = std::vector<double>;

struct Ctx {
  ThreadPool pool{2};
  ExecContext ctx{&pool, true};
};

TEST_CASE("Gemm matches naive in every transpose mode") {
  Ctx c;
  const int64_t M = 70, N = 130, K = 33;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto a = Random(M * K, 1), b = Random(K * N, 2), out = Random(M * N, 3);
      auto ref = out;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += double(ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
          ref[i * N + j] = float(0.5 * s + 2.0 * out[i * N + j]);
        }
      Gemm(c.ctx, ta, tb, M, N, K, 0.5f, a.data(), ta ? M : K, b.data(), tb ? K : N, 2.0f,
           out.data(), N);
      CHECK(ErrRatio(out, ref, 1e-5) <= 1);
    }
  }
}

TEST_CASE("Embedding forward and backward") {
  Ctx c;
  const int64_t Vn = 7, C = 5, N = 9;
  std::vector<int32_t> ids = {3, 0, 6, 3, 3, 1, 0, 6, 2};
  auto table = Random(Vn * C, 4);
  std::vector<float> out(N * C, 1.0f);
  EmbeddingForward(c.ctx, ids.data(), N, table.data(), C, out.data(), /*accumulate=*/true);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < C; ++k) CHECK(out[n * C + k] == table[ids[n] * C + k] + 1.0f);
  auto dout = Random(N * C, 5);
  std::vector<float> dt(Vn * C, 0.0f);
  EmbeddingBackward(c.ctx, ids.data(), N, dout.data(), C, dt.data());
  auto f = [&](const V& t) {
    V y(N * C);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < C; ++k) y[n * C + k] = t[ids[n] * C + k];
    return WeightedSum(y, ToDouble(dout));
  };
  CHECK(ErrRatio(dt, NumericGrad(f, ToDouble(table)), 1e-5) <= 1);
}

TEST_CASE("RMSNorm backward vs float64 finite differences") {
  Ctx c;
  const int64_t N = 6, C = 37;
  const float eps = 1e-5f;
  auto x = Random(N * C, 6), w = Random(C, 7), dy = Random(N * C, 8);
  std::vector<float> y(N * C), rstd(N), dx(N * C), dw(C, 0.0f);
  RmsNormForward(c.ctx, x.data(), w.data(), N, C, eps, y.data(), rstd.data());
  RmsNormBackward(c.ctx, x.data(), w.data(), rstd.data(), dy.data(), N, C, dx.data(), dw.data());
  auto ref = [&](const V& xv, const V& wv) {
    V out(N * C);
    for (int64_t n = 0; n < N; ++n) {
      double ss = 0;
      for (int64_t k = 0; k < C; ++k) ss += xv[n * C + k] * xv[n * C + k];
      double r = 1 / std::sqrt(ss / C + eps);
      for (int64_t k = 0; k < C; ++k) out[n * C + k] = xv[n * C + k] * r * wv[k];
    }
    return out;
  };
  CHECK(ErrRatio(y, ref(ToDouble(x), ToDouble(w)), 1e-5) <= 1);
  auto gx = NumericGrad([&](const V& xv) { return WeightedSum(ref(xv, ToDouble(w)), ToDouble(dy)); },
                        ToDouble(x));
  auto gw = NumericGrad([&](const V& wv) { return WeightedSum(ref(ToDouble(x), wv), ToDouble(dy)); },
                        ToDouble(w));
  CHECK(ErrRatio(dx, gx, 1e-4) <= 1);
  CHECK(ErrRatio(dw, gw, 1e-4) <= 1);
}

TEST_CASE("Linear backward vs float64 finite differences") {
  Ctx c;
  const int64_t N = 5, in = 11, out = 7;
  auto x = Random(N * in, 9), W = Random(out * in, 10), b = Random(out, 11), dy = Random(N * out, 12);
  std::vector<float> y(N * out), dx(N * in), dW(out * in, 0.0f), db(out, 0.0f);
  LinearForward(c.ctx, x.data(), W.data(), b.data(), N, in, out, y.data());
  LinearBackward(c.ctx, x.data(), W.data(), dy.data(), N, in, out, dx.data(), dW.data(), db.data());
  auto ref = [&](const V& xv, const V& Wv, const V& bv) {
    V o(N * out);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < out; ++j) {
        double s = bv[j];
        for (int64_t k = 0; k < in; ++k) s += xv[n * in + k] * Wv[j * in + k];
        o[n * out + j] = s;
      }
    return o;
  };
  V X = ToDouble(x), Wd = ToDouble(W), B = ToDouble(b), DY = ToDouble(dy);
  CHECK(ErrRatio(y, ref(X, Wd, B), 1e-5) <= 1);
  CHECK(ErrRatio(dx, NumericGrad([&](const V& v) { return WeightedSum(ref(v, Wd, B), DY); }, X), 1e-4) <= 1);
  CHECK(ErrRatio(dW, NumericGrad([&](const V& v) { return WeightedSum(ref(X, v, B), DY); }, Wd), 1e-4) <= 1);
  CHECK(ErrRatio(db, NumericGrad([&](const V& v) { return WeightedSum(ref(X, Wd, v), DY); }, B), 1e-4) <= 1);
}

TEST_CASE("Linear with bf16_linear: bf16-rounded GEMM inputs, fp32 accumulation") {
  Ctx c;
  c.ctx.bf16_linear = true;
  const int64_t N = 67, in = 45, out = 29;
  auto x = Random(N * in, 31), W = Random(out * in, 32), b = Random(out, 33), dy = Random(N * out, 34);
  auto dW0 = Random(out * in, 35);
  std::vector<float> y(N * out), dx(N * in), dW = dW0, db(out, 0.0f);
  LinearForward(c.ctx, x.data(), W.data(), b.data(), N, in, out, y.data());
  LinearBackward(c.ctx, x.data(), W.data(), dy.data(), N, in, out, dx.data(), dW.data(), db.data());
  auto r = [](const std::vector<float>& v) {  // float64 copy of the bf16-rounded values
    V o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = Bf16ToF32(F32ToBf16(v[i]));
    return o;
  };
  const V X = r(x), Wr = r(W), DY = r(dy);
  V yr(N * out), dxr(N * in, 0.0), dWr(ToDouble(dW0)), dbr(out, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < out; ++j) {
      double s = b[j];
      for (int64_t k = 0; k < in; ++k) s += X[n * in + k] * Wr[j * in + k];
      yr[n * out + j] = s;
      dbr[j] += dy[n * out + j];  // the bias gradient stays fp32 (unrounded dy)
      for (int64_t k = 0; k < in; ++k) {
        dxr[n * in + k] += DY[n * out + j] * Wr[j * in + k];
        dWr[j * in + k] += DY[n * out + j] * X[n * in + k];
      }
    }
  // fp32 accumulation of exact products: well inside 1e-5 of the largest entry at these sizes.
  CHECK(ErrRatio(y, yr, 1e-5) <= 1);
  CHECK(ErrRatio(dx, dxr, 1e-5) <= 1);
  CHECK(ErrRatio(dW, dWr, 1e-5) <= 1);
  CHECK(ErrRatio(db, dbr, 1e-5) <= 1);
  // The rounding is real: the unrounded fp32 product is far outside that tolerance.
  V yf(N * out);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < out; ++j) {
      double s = b[j];
      for (int64_t k = 0; k < in; ++k) s += double(x[n * in + k]) * W[j * in + k];
      yf[n * out + j] = s;
    }
  CHECK(ErrRatio(y, yf, 1e-5) > 10);
}

TEST_CASE("GELU, SwiGLU and softmax backward vs float64 finite differences") {
  Ctx c;
  const int64_t N = 4, F = 19;
  auto x = Random(N * 2 * F, 13, 2.0f), dy = Random(N * 2 * F, 14);
  V X = ToDouble(x), DY = ToDouble(dy);
  SECTION("gelu") {
    const int64_t n = N * 2 * F;
    std::vector<float> y(n), dx(n);
    GeluForward(c.ctx, x.data(), y.data(), n);
    GeluBackward(c.ctx, x.data(), dy.data(), dx.data(), n);
    auto ref = [&](const V& v) {
      V o(n);
      for (int64_t i = 0; i < n; ++i)
        o[i] = 0.5 * v[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (v[i] + 0.044715 * std::pow(v[i], 3))));
      return o;
    };
    CHECK(ErrRatio(y, ref(X), 1e-5) <= 1);
    CHECK(ErrRatio(dx, NumericGrad([&](const V& v) { return WeightedSum(ref(v), DY); }, X), 1e-4) <= 1);
  }
  SECTION("swiglu") {
    std::vector<float> y(N * F), dx(N * 2 * F);
    SwiGluForward(c.ctx, x.data(), N, F, y.data());
    SwiGluBackward(c.ctx, x.data(), dy.data(), N, F, dx.data());
    auto ref = [&](const V& v) {
      V o(N * F);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t f = 0; f < F; ++f) {
          double a = v[n * 2 * F + f], g = v[n * 2 * F + F + f];
          o[n * F + f] = a / (1 + std::exp(-a)) * g;
        }
      return o;
    };
    V DYF(DY.begin(), DY.begin() + N * F);
    CHECK(ErrRatio(y, ref(X), 1e-5) <= 1);
    CHECK(ErrRatio(dx, NumericGrad([&](const V& v) { return WeightedSum(ref(v), DYF); }, X), 1e-4) <= 1);
  }
  SECTION("softmax") {
    const int64_t C = 2 * F;
    std::vector<float> y(N * C), dx(N * C);
    SoftmaxForward(c.ctx, x.data(), N, C, y.data());
    SoftmaxBackward(c.ctx, y.data(), dy.data(), N, C, dx.data());
    auto ref = [&](const V& v) {
      V o(N * C);
      for (int64_t n = 0; n < N; ++n) {
        double m = -1e300, s = 0;
        for (int64_t k = 0; k < C; ++k) m = std::max(m, v[n * C + k]);
        for (int64_t k = 0; k < C; ++k) s += std::exp(v[n * C + k] - m);
        for (int64_t k = 0; k < C; ++k) o[n * C + k] = std::exp(v[n * C + k] - m) / s;
      }
      return o;
    };
    CHECK(ErrRatio(y, ref(X), 1e-5) <= 1);
    CHECK(ErrRatio(dx, NumericGrad([&](const V& v) { return WeightedSum(ref(v), DY); }, X), 1e-4) <= 1);
  }
}

TEST_CASE("AdamW matches a float64 reference over three steps") {
  Ctx c;
  const int64_t n = 1000;
  AdamWOptions opt;
  opt.lr = 1e-2f;
  opt.weight_decay = 0.1f;
  auto p = Random(n, 15);
  std::vector<float> m(n, 0), v(n, 0);
  V P = ToDouble(p), Md(n, 0), Vd(n, 0);
  for (int step = 1; step <= 3; ++step) {
    auto g = Random(n, 100 + step);
    AdamWStep(c.ctx, opt, step, p.data(), g.data(), m.data(), v.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      P[i] *= 1 - double(opt.lr) * opt.weight_decay;
      Md[i] = opt.beta1 * Md[i] + (1 - double(opt.beta1)) * g[i];
      Vd[i] = opt.beta2 * Vd[i] + (1 - double(opt.beta2)) * g[i] * g[i];
      double mh = Md[i] / (1 - std::pow(double(opt.beta1), step));
      double vh = Vd[i] / (1 - std::pow(double(opt.beta2), step));
      P[i] -= opt.lr * mh / (std::sqrt(vh) + opt.eps);
    }
  }
  CHECK(ErrRatio(p, P, 1e-5) <= 1);
}

TEST_CASE("Global-norm clipping") {
  Ctx c;
  auto a = Random(50000, 16), b = Random(7, 17);
  double ss = 0;
  for (float x : a) ss += double(x) * x;
  for (float x : b) ss += double(x) * x;
  const double norm = std::sqrt(ss);
  auto a0 = a;
  double got = ClipGradNorm(c.ctx, {{a.data(), 50000}, {b.data(), 7}}, 1.0);
  CHECK(std::fabs(got - norm) <= 1e-9 * norm);
  CHECK(GlobalL2Norm(c.ctx, {{a.data(), 50000}, {b.data(), 7}}) == Approx(1.0).epsilon(1e-5));
  CHECK(a[123] == Approx(a0[123] / norm).epsilon(1e-5));
  // Below the threshold nothing changes.
  auto a1 = a;
  ClipGradNorm(c.ctx, {{a.data(), 50000}}, 10.0);
  CHECK(std::memcmp(a.data(), a1.data(), a.size() * 4) == 0);
}

TEST_CASE("f16 casts match F16C hardware rounding; bf16 rounds to nearest even") {
  std::mt19937 rng(18);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    REQUIRE(F32ToF16(f) == _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = F16ToF32(static_cast<uint16_t>(h));
    float hw = _cvtsh_ss(static_cast<uint16_t>(h));
    if (std::isnan(hw)) { CHECK(std::isnan(f)); continue; }
    REQUIRE(std::memcmp(&f, &hw, 4) == 0);
    REQUIRE(F32ToF16(f) == h);
  }
  // bf16: the result is the nearer neighbour, ties to the even mantissa.
  for (int i = 0; i < 1000000; ++i) {
    uint32_t u = rng() % 0x7f7f0000u;  // finite, below the largest bf16
    float f;
    std::memcpy(&f, &u, 4);
    float lo = Bf16ToF32(static_cast<uint16_t>(u >> 16));
    float hi = Bf16ToF32(static_cast<uint16_t>((u >> 16) + 1));
    float r = Bf16ToF32(F32ToBf16(f));
    double dl = double(f) - lo, dh = double(hi) - f;
    float want = dl < dh ? lo : (dh < dl ? hi : (((u >> 16) & 1) ? hi : lo));
    REQUIRE(r == want);
  }
  CHECK(F32ToBf16(1.0f) == 0x3f80);
  CHECK(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
  CHECK(F32ToF16(65520.0f) == 0x7c00);
  CHECK(F32ToF16(65504.0f) == 0x7bff);
}

TEST_CASE("bf16 GEMM accumulates in fp32") {
  Ctx c;
  const int64_t M = 40, N = 50, K = 64;
  auto a = Random(M * K, 19), b = Random(N * K, 20);
  std::vector<uint16_t> ab(M * K), bb(N * K);
  CastF32ToBf16(c.ctx, a.data(), ab.data(), M * K);
  CastF32ToBf16(c.ctx, b.data(), bb.data(), N * K);
  std::vector<float> out(M * N);
  GemmBf16(c.ctx, false, true, M, N, K, 1.0f, ab.data(), K, bb.data(), K, 0.0f, out.data(), N);
  V ref(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k)
        ref[i * N + j] += double(Bf16ToF32(ab[i * K + k])) * Bf16ToF32(bb[j * K + k]);
  CHECK(ErrRatio(out, ref, 1e-5) <= 1);
}

}  // namespace
}  // namespace ember::kernels
