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

// Dense reference on packed qkv rows [B,T,(H+2KV)*hd] (q heads, k heads, v heads); query head h
// reads kv head h / (H/KV). Returns o[B,T,H,hd]; fills grads if dout given.
struct Ref {
  AttentionShape s;
  bool Visible(int64_t t, int64_t j) const { return j <= t && (s.window == 0 || t - j < s.window); }
  // which 0: q head h; 1, 2: k, v of query head h's kv head.
  int64_t Idx(int64_t b, int64_t t, int64_t which, int64_t h) const {
    const int64_t KV = s.kv_heads(), row = (b * s.T + t) * (s.H + 2 * KV) * s.hd;
    if (which == 0) return row + h * s.hd;
    return row + (s.H + (which - 1) * KV + h / (s.H / KV)) * s.hd;
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
  const int64_t C = s.H * s.hd, KC = s.kv_heads() * s.hd, row = C + 2 * KC;
  Result r;
  r.o.resize(s.B * s.T * C);
  r.lse.resize(s.B * s.H * s.T);
  r.dqkv.assign(qkv.size(), -1.0f);
  AttentionForward(ctx, s, qkv.data(), qkv.data() + C, qkv.data() + C + KC, row, r.o.data(), C,
                   r.lse.data());
  float* d = r.dqkv.data();
  AttentionBackward(ctx, s, qkv.data(), qkv.data() + C, qkv.data() + C + KC, row, r.o.data(),
                    dout.data(), C, r.lse.data(), d, d + C, d + C + KC);
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

TEST_CASE("Grouped-query attention equals the dense reference; its reference matches finite differences") {
  {
    AttentionShape s{1, 7, 4, 4, 0, 2};
    Ref ref{s};
    auto qkv = ToDouble(Random(7 * 8 * 4, 21));
    auto dout = ToDouble(Random(7 * 16, 22));
    V dqkv;
    ref.Forward(qkv, &dout, &dqkv);
    auto num = NumericGrad([&](const V& x) { return WeightedSum(ref.Forward(x), dout); }, qkv);
    CHECK(ErrRatio(dqkv, num, 1e-7) <= 1);
  }
  ThreadPool pool(2);
  for (bool det : {true, false}) {
    ExecContext ctx{&pool, det};
    for (int64_t KV : {1, 2, 3}) {
      for (int64_t window : {0, 45}) {
        AttentionShape s{2, 150, 6, 16, window, KV};
        const int64_t row = (s.H + 2 * KV) * s.hd;
        auto qkv = Random(s.B * s.T * row, 30 + KV + window);
        auto dout = Random(s.B * s.T * s.H * s.hd, 31 + KV);
        auto got = RunKernel(ctx, s, qkv, dout);
        Ref ref{s};
        V dref, dd = ToDouble(dout);
        V oref = ref.Forward(ToDouble(qkv), &dd, &dref);
        INFO("KV " << KV << " window " << window << " deterministic " << det);
        CHECK(ErrRatio(got.o, oref, 2e-5) <= 1);
        CHECK(ErrRatio(got.dqkv, dref, 2e-5) <= 1);
      }
    }
  }
  // Determinism across pool sizes with GQA.
  AttentionShape s{1, 200, 4, 32, 0, 2};
  auto qkv = Random(200 * 8 * 32, 40), dout = Random(200 * 4 * 32, 41);
  ThreadPool p1(1), p3(3);
  auto a = RunKernel(ExecContext{&p1, true}, s, qkv, dout);
  auto b = RunKernel(ExecContext{&p3, true}, s, qkv, dout);
  CHECK(std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * 4) == 0);
  CHECK(std::memcmp(a.o.data(), b.o.data(), a.o.size() * 4) == 0);
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
