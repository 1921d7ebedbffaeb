// Flash attention vs a dense float64 reference with a causal band mask; the reference backward is
// itself checked by finite differences; determinism across runs and pool sizes.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "kernels/attention.h"
#include "testing/kernel_test_util.h"

namespace ember::kernels {
namespace {

using testing::ErrRatio;
using testing::NumericGrad;
using testing::Random;
using testing::ToDouble;
using testing::WeightedSum;
using V = std::vector<double>;

// Dense reference on packed qkv[B,T,3,H,hd]; returns o[B,T,H,hd]; fills grads if dout given.
struct Ref {
  AttentionShape s;
  bool Visible(int64_t t, int64_t j) const { return j <= t && (s.window == 0 || t - j < s.window); }
  int64_t Idx(int64_t b, int64_t t, int64_t which, int64_t h) const {
    return ((b * s.T + t) * 3 + which) * s.H * s.hd + h * s.hd;
  }
  V Forward(const V& qkv, const V* dout = nullptr, V* dqkv = nullptr) const {
    const int64_t T = s.T, hd = s.hd, C = s.H * hd;
    V o(s.B * T * C, 0.0);
    if (dqkv) dqkv->assign(qkv.size(), 0.0);
    const double scale = 1 / std::sqrt(double(hd));
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          V p(T, 0.0);
          double m = -1e300, z = 0;
          const double* q = &qkv[Idx(b, t, 0, h)];
          for (int64_t j = 0; j < T; ++j) {
            if (!Visible(t, j)) continue;
            double d = 0;
            for (int64_t k = 0; k < hd; ++k) d += q[k] * qkv[Idx(b, j, 1, h) + k];
            p[j] = d * scale;
            m = std::max(m, p[j]);
          }
          for (int64_t j = 0; j < T; ++j) if (Visible(t, j)) z += (p[j] = std::exp(p[j] - m));
          double* orow = &o[(b * T + t) * C + h * hd];
          for (int64_t j = 0; j < T; ++j) {
            if (!Visible(t, j)) continue;
            p[j] /= z;
            for (int64_t k = 0; k < hd; ++k) orow[k] += p[j] * qkv[Idx(b, j, 2, h) + k];
          }
          if (!dqkv) continue;
          const double* dor = &(*dout)[(b * T + t) * C + h * hd];
          double D = 0;
          for (int64_t k = 0; k < hd; ++k) D += dor[k] * orow[k];
          for (int64_t j = 0; j < T; ++j) {
            if (!Visible(t, j)) continue;
            double dp = 0;
            for (int64_t k = 0; k < hd; ++k) dp += dor[k] * qkv[Idx(b, j, 2, h) + k];
            double ds = p[j] * (dp - D) * scale;
            for (int64_t k = 0; k < hd; ++k) {
              (*dqkv)[Idx(b, j, 2, h) + k] += p[j] * dor[k];
              (*dqkv)[Idx(b, t, 0, h) + k] += ds * qkv[Idx(b, j, 1, h) + k];
              (*dqkv)[Idx(b, j, 1, h) + k] += ds * q[k];
            }
          }
        }
    return o;
  }
};

struct Result {
  std::vector<float> o, lse, dqkv;
};

Result RunKernel(const ExecContext& ctx, const AttentionShape& s, const std::vector<float>& qkv,
                 const std::vector<float>& dout) {
  const int64_t C = s.H * s.hd;
  Result r;
  r.o.resize(s.B * s.T * C);
  r.lse.resize(s.B * s.H * s.T);
  r.dqkv.assign(qkv.size(), -1.0f);
  AttentionForward(ctx, s, qkv.data(), qkv.data() + C, qkv.data() + 2 * C, 3 * C, r.o.data(), C,
                   r.lse.data());
  float* d = r.dqkv.data();
  AttentionBackward(ctx, s, qkv.data(), qkv.data() + C, qkv.data() + 2 * C, 3 * C, r.o.data(),
                    dout.data(), C, r.lse.data(), d, d + C, d + 2 * C);
  return r;
}

TEST_CASE("Reference attention backward matches finite differences") {
  Ref ref{AttentionShape{1, 9, 2, 4, 3}};
  auto qkv = ToDouble(Random(9 * 3 * 8, 1));
  auto dout = ToDouble(Random(9 * 8, 2));
  V dqkv;
  ref.Forward(qkv, &dout, &dqkv);
  auto num = NumericGrad([&](const V& x) { return WeightedSum(ref.Forward(x), dout); }, qkv);
  CHECK(ErrRatio(dqkv, num, 1e-7) <= 1);
}

TEST_CASE("Flash attention (dense and windowed) equals the band-masked dense reference") {
  ThreadPool pool(2);
  for (bool det : {true, false}) {
    ExecContext ctx{&pool, det};
    for (int64_t window : {0, 1, 37, 64, 100}) {
      AttentionShape s{2, 200, 2, 16, window};
      const int64_t C = s.H * s.hd;
      auto qkv = Random(s.B * s.T * 3 * C, 3 + window);
      auto dout = Random(s.B * s.T * C, 4 + window);
      auto got = RunKernel(ctx, s, qkv, dout);
      Ref ref{s};
      V dref, dd = ToDouble(dout);
      V oref = ref.Forward(ToDouble(qkv), &dd, &dref);
      INFO("window " << window << " deterministic " << det);
      CHECK(ErrRatio(got.o, oref, 2e-5) <= 1);
      CHECK(ErrRatio(got.dqkv, dref, 2e-5) <= 1);
    }
  }
}

TEST_CASE("Attention is bitwise deterministic across runs and pool sizes") {
  AttentionShape s{1, 300, 3, 32, 70};
  const int64_t C = s.H * s.hd;
  auto qkv = Random(s.B * s.T * 3 * C, 5), dout = Random(s.B * s.T * C, 6);
  ThreadPool p1(1), p3(3);
  ExecContext c1{&p1, true}, c3{&p3, true};
  auto a = RunKernel(c1, s, qkv, dout), b = RunKernel(c3, s, qkv, dout), c = RunKernel(c3, s, qkv, dout);
  for (const Result* r : {&b, &c}) {
    CHECK(std::memcmp(a.o.data(), r->o.data(), a.o.size() * 4) == 0);
    CHECK(std::memcmp(a.lse.data(), r->lse.data(), a.lse.size() * 4) == 0);
    CHECK(std::memcmp(a.dqkv.data(), r->dqkv.data(), a.dqkv.size() * 4) == 0);
  }
}

}  // namespace
}  // namespace ember::kernels
