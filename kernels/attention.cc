#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/vec.h"

namespace ember::kernels {
namespace {

constexpr int64_t kBq = 64;  // query rows per forward task
constexpr int64_t kBk = 64;  // keys per tile

// First key visible from query row t.
inline int64_t FirstKey(const AttentionShape& s, int64_t t) {
  return s.window > 0 ? std::max<int64_t>(0, t - s.window + 1) : 0;
}

// Copies rows [j0, j1) of x (row stride `stride`) transposed into xt[hd][kBk].
inline void LoadTransposed(const float* x, int64_t stride, int64_t j0, int64_t j1, int64_t hd,
                           float* xt) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* row = x + j * stride;
    for (int64_t d = 0; d < hd; ++d) xt[d * kBk + (j - j0)] = row[d];
  }
}

// s[j] = a . xt[:, j] for j in [lo, hi) (tile-local indices), summed over d in order.
inline void RowTimesTile(const float* a, const float* xt, int64_t hd, int64_t lo, int64_t hi,
                         float* s) {
  for (int64_t j = lo; j < hi; ++j) s[j] = 0.0f;
  for (int64_t d = 0; d < hd; ++d) {
    const float ad = a[d];
    const float* col = xt + d * kBk;
    for (int64_t j = lo; j < hi; ++j) s[j] += ad * col[j];
  }
}

}  // namespace

void AttentionForward(const ExecContext& ctx, const AttentionShape& s, const float* q,
                      const float* k, const float* v, int64_t qkv_stride, float* o,
                      int64_t o_stride, float* lse) {
  const int64_t hd = s.hd, T = s.T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t qblocks = (T + kBq - 1) / kBq;
  auto task = [&](int64_t id) {
    const int64_t bh = id / qblocks, qb = id % qblocks;
    const int64_t b = bh / s.H, h = bh % s.H;
    const int64_t base = b * T * qkv_stride + h * hd;
    const float* qh = q + base;
    const float* kh = k + base;
    const float* vh = v + base;
    float* oh = o + b * T * o_stride + h * hd;
    float* lseh = lse + bh * T;
    const int64_t q0 = qb * kBq, q1 = std::min(T, q0 + kBq);
    std::vector<float> kt(hd * kBk), qs(hd), sc(kBk), acc((q1 - q0) * hd, 0.0f);
    std::vector<float> m(q1 - q0, -std::numeric_limits<float>::infinity()), l(q1 - q0, 0.0f);
    const int64_t k_first = FirstKey(s, q0) / kBk * kBk;
    for (int64_t k0 = k_first; k0 < q1; k0 += kBk) {
      const int64_t k1 = std::min(q1, k0 + kBk);
      LoadTransposed(kh, qkv_stride, k0, k1, hd, kt.data());
      for (int64_t t = q0; t < q1; ++t) {
        const int64_t lo = std::max(k0, FirstKey(s, t)) - k0, hi = std::min(k1 - 1, t) + 1 - k0;
        if (lo >= hi) continue;
        const float* qr = qh + t * qkv_stride;
        for (int64_t d = 0; d < hd; ++d) qs[d] = qr[d] * scale;
        RowTimesTile(qs.data(), kt.data(), hd, lo, hi, sc.data());
        const int64_t r = t - q0;
        float mx = m[r];
        for (int64_t j = lo; j < hi; ++j) mx = std::max(mx, sc[j]);
        const float corr = vec::Exp(m[r] - mx);  // m = -inf on the first tile: corr ~ 0, acc = 0
        float* a = acc.data() + r * hd;
        for (int64_t j = lo; j < hi; ++j) sc[j] = vec::Exp(sc[j] - mx);
        l[r] = l[r] * corr + vec::Sum(sc.data() + lo, hi - lo);
        m[r] = mx;
        vec::Scale(corr, a, hd);
        for (int64_t j = lo; j < hi; ++j) vec::Axpy(sc[j], vh + (k0 + j) * qkv_stride, a, hd);
      }
    }
    for (int64_t t = q0; t < q1; ++t) {
      const int64_t r = t - q0;
      const float inv = 1.0f / l[r];
      float* orow = oh + t * o_stride;
      for (int64_t d = 0; d < hd; ++d) orow[d] = acc[r * hd + d] * inv;
      lseh[t] = m[r] + std::log(l[r]);
    }
  };
  const int64_t tasks = s.B * s.H * qblocks;
  if (ctx.pool) ctx.pool->Run(tasks, task); else for (int64_t i = 0; i < tasks; ++i) task(i);
}

void AttentionBackward(const ExecContext& ctx, const AttentionShape& s, const float* q,
                       const float* k, const float* v, int64_t qkv_stride, const float* o,
                       const float* dout, int64_t o_stride, const float* lse, float* dq,
                       float* dk, float* dv) {
  const int64_t hd = s.hd, T = s.T, BH = s.B * s.H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t kblocks = (T + kBk - 1) / kBk;
  // Splits of each head's key tiles: 1 in deterministic mode; enough to fill the pool otherwise.
  int64_t splits = 1;
  if (!ctx.deterministic) {
    splits = std::min<int64_t>(kblocks, (2 * ctx.num_threads() + BH - 1) / BH);
  }
  const int64_t tiles_per_split = (kblocks + splits - 1) / splits;
  // dq accumulators: the output itself (splits == 1) or one [BH, T, hd] buffer per split.
  std::vector<float> dq_parts(splits > 1 ? splits * BH * T * hd : 0, 0.0f);
  std::vector<float> delta(BH * T);  // D[t] = dout[t] . o[t]

  auto run = [&](int64_t n, auto fn) {
    if (ctx.pool) ctx.pool->Run(n, fn); else for (int64_t i = 0; i < n; ++i) fn(i);
  };
  run(BH, [&](int64_t bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = (b * T + t) * o_stride + h * hd;
      delta[bh * T + t] = vec::Dot(dout + row, o + row, hd);
      if (splits == 1) std::memset(dq + (b * T + t) * qkv_stride + h * hd, 0, hd * sizeof(float));
    }
  });

  run(BH * splits, [&](int64_t id) {
    const int64_t bh = id / splits, split = id % splits;
    const int64_t b = bh / s.H, h = bh % s.H;
    const int64_t base = b * T * qkv_stride + h * hd;
    const float* qh = q + base;
    const float* kh = k + base;
    const float* vh = v + base;
    const float* doh = dout + b * T * o_stride + h * hd;
    const float* lseh = lse + bh * T;
    const float* dlt = delta.data() + bh * T;
    float* dq_out = splits == 1 ? dq + base : dq_parts.data() + (split * BH + bh) * T * hd;
    const int64_t dq_stride = splits == 1 ? qkv_stride : hd;
    std::vector<float> kt(hd * kBk), vt(hd * kBk), p(kBk), dp(kBk);
    std::vector<float> dkb(kBk * hd), dvb(kBk * hd);
    const int64_t tb0 = split * tiles_per_split, tb1 = std::min(kblocks, tb0 + tiles_per_split);
    for (int64_t kb = tb0; kb < tb1; ++kb) {
      const int64_t k0 = kb * kBk, k1 = std::min(T, k0 + kBk);
      LoadTransposed(kh, qkv_stride, k0, k1, hd, kt.data());
      LoadTransposed(vh, qkv_stride, k0, k1, hd, vt.data());
      std::fill(dkb.begin(), dkb.end(), 0.0f);
      std::fill(dvb.begin(), dvb.end(), 0.0f);
      const int64_t t_end = s.window > 0 ? std::min(T, k1 + s.window - 1) : T;
      for (int64_t t = k0; t < t_end; ++t) {
        const int64_t lo = std::max(k0, FirstKey(s, t)) - k0, hi = std::min(k1 - 1, t) + 1 - k0;
        if (lo >= hi) continue;
        const float* qr = qh + t * qkv_stride;
        const float* dor = doh + t * o_stride;
        RowTimesTile(qr, kt.data(), hd, lo, hi, p.data());
        RowTimesTile(dor, vt.data(), hd, lo, hi, dp.data());
        const float l = lseh[t], D = dlt[t];
        float* dqr = dq_out + t * dq_stride;
        for (int64_t j = lo; j < hi; ++j) p[j] = vec::Exp(p[j] * scale - l);
        for (int64_t j = lo; j < hi; ++j) {
          const float pj = p[j];
          const float ds = pj * (dp[j] - D) * scale;
          vec::Axpy(pj, dor, dvb.data() + j * hd, hd);
          vec::Axpy(ds, qr, dkb.data() + j * hd, hd);
          vec::Axpy(ds, kh + (k0 + j) * qkv_stride, dqr, hd);
        }
      }
      for (int64_t j = k0; j < k1; ++j) {
        std::memcpy(dk + base + j * qkv_stride, dkb.data() + (j - k0) * hd, hd * sizeof(float));
        std::memcpy(dv + base + j * qkv_stride, dvb.data() + (j - k0) * hd, hd * sizeof(float));
      }
    }
  });

  if (splits > 1) {
    run(BH, [&](int64_t bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      for (int64_t t = 0; t < T; ++t) {
        float* dst = dq + (b * T + t) * qkv_stride + h * hd;
        std::memcpy(dst, dq_parts.data() + (bh * T + t) * hd, hd * sizeof(float));
        for (int64_t sp = 1; sp < splits; ++sp)
          vec::Axpy(1.0f, dq_parts.data() + ((sp * BH + bh) * T + t) * hd, dst, hd);
      }
    });
  }
}

}  // namespace ember::kernels
