#include "kernels/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/vec.h"

namespace ember::kernels {
namespace {

// Tiles are multiplied with single-threaded OpenBLAS sgemm calls (one per tile product) straight
// from the strided q/k/v/o rows, so no tile is copied or transposed.
constexpr int64_t kBq = 64;  // query rows per tile
constexpr int64_t kBk = 64;  // keys per tile

// First key visible from query row t.
inline int64_t FirstKey(const AttentionShape& s, int64_t t) {
  return s.window > 0 ? std::max<int64_t>(0, t - s.window + 1) : 0;
}

// Row-major C[M,N] = alpha * op(A) op(B) + beta * C on one thread.
inline void TileGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                     float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void PinOpenBlasSingleThreaded() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

}  // namespace

void AttentionForward(const ExecContext& ctx, const AttentionShape& s, const float* q,
                      const float* k, const float* v, int64_t qkv_stride, float* o,
                      int64_t o_stride, float* lse) {
  PinOpenBlasSingleThreaded();
  const int64_t hd = s.hd, T = s.T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t qblocks = (T + kBq - 1) / kBq;
  const int64_t group = s.H / s.kv_heads();
  auto task = [&](int64_t id) {
    const int64_t bh = id / qblocks, qb = id % qblocks;
    const int64_t b = bh / s.H, h = bh % s.H;
    const int64_t base = b * T * qkv_stride + h * hd;
    const int64_t kv_base = b * T * qkv_stride + h / group * hd;
    const float* qh = q + base;
    const float* kh = k + kv_base;
    const float* vh = v + kv_base;
    float* oh = o + b * T * o_stride + h * hd;
    float* lseh = lse + bh * T;
    const int64_t q0 = qb * kBq, q1 = std::min(T, q0 + kBq), nq = q1 - q0;
    std::vector<float> sc(kBq * kBk), acc(nq * hd, 0.0f);
    std::vector<float> m(nq, -std::numeric_limits<float>::infinity()), l(nq, 0.0f);
    const int64_t k_first = FirstKey(s, q0) / kBk * kBk;
    for (int64_t k0 = k_first; k0 < q1; k0 += kBk) {
      const int64_t k1 = std::min(q1, k0 + kBk), nk = k1 - k0;
      // sc[r, j] = scale * q[q0 + r] . k[k0 + j]
      TileGemm(false, true, nq, nk, hd, scale, qh + q0 * qkv_stride, qkv_stride,
               kh + k0 * qkv_stride, qkv_stride, 0.0f, sc.data(), kBk);
      for (int64_t r = 0; r < nq; ++r) {
        const int64_t t = q0 + r;
        float* p = sc.data() + r * kBk;
        const int64_t lo = std::max(k0, FirstKey(s, t)) - k0, hi = std::min(k1 - 1, t) + 1 - k0;
        if (lo >= hi) {  // no visible key in this tile: contributes nothing
          std::fill(p, p + nk, 0.0f);
          continue;
        }
        float mx = m[r];
        for (int64_t j = lo; j < hi; ++j) mx = std::max(mx, p[j]);
        const float corr = vec::Exp(m[r] - mx);  // m = -inf on the first tile: corr ~ 0, acc = 0
        for (int64_t j = lo; j < hi; ++j) p[j] = vec::Exp(p[j] - mx);
        std::fill(p, p + lo, 0.0f);
        std::fill(p + hi, p + nk, 0.0f);
        l[r] = l[r] * corr + vec::Sum(p + lo, hi - lo);
        m[r] = mx;
        vec::Scale(corr, acc.data() + r * hd, hd);
      }
      // acc += p @ v[k0:k1]
      TileGemm(false, false, nq, hd, nk, 1.0f, sc.data(), kBk, vh + k0 * qkv_stride, qkv_stride,
               1.0f, acc.data(), hd);
    }
    for (int64_t r = 0; r < nq; ++r) {
      const int64_t t = q0 + r;
      const float inv = 1.0f / l[r];
      float* orow = oh + t * o_stride;
      const float* a = acc.data() + r * hd;
      for (int64_t d = 0; d < hd; ++d) orow[d] = a[d] * inv;
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
  PinOpenBlasSingleThreaded();
  const int64_t hd = s.hd, T = s.T, BH = s.B * s.H, KV = s.kv_heads(), BKV = s.B * KV;
  const int64_t group = s.H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t kblocks = (T + kBk - 1) / kBk;
  // Splits of each head's key tiles: 1 in deterministic mode; enough to fill the pool otherwise.
  int64_t splits = 1;
  if (!ctx.deterministic) {
    splits = std::min<int64_t>(kblocks, (2 * ctx.num_threads() + BKV - 1) / BKV);
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

  // One task per (batch, kv head, split): it owns dk/dv rows of its key tiles, and adds the group's
  // query heads into them in head order.
  run(BKV * splits, [&](int64_t id) {
    const int64_t bkv = id / splits, split = id % splits;
    const int64_t b = bkv / KV, kvh = bkv % KV;
    const int64_t kv_base = b * T * qkv_stride + kvh * hd;
    const float* kh = k + kv_base;
    const float* vh = v + kv_base;
    std::vector<float> p(kBq * kBk), dp(kBq * kBk);
    const int64_t tb0 = split * tiles_per_split, tb1 = std::min(kblocks, tb0 + tiles_per_split);
    for (int64_t kb = tb0; kb < tb1; ++kb) {
      const int64_t k0 = kb * kBk, k1 = std::min(T, k0 + kBk), nk = k1 - k0;
      const float* kt = kh + k0 * qkv_stride;
      const float* vt = vh + k0 * qkv_stride;
      float* dkt = dk + kv_base + k0 * qkv_stride;
      float* dvt = dv + kv_base + k0 * qkv_stride;
      const int64_t t_end = s.window > 0 ? std::min(T, k1 + s.window - 1) : T;
      float beta = 0.0f;  // the first (head, query block) overwrites dk/dv rows, the rest accumulate
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const int64_t bh = b * s.H + h;
        const int64_t base = b * T * qkv_stride + h * hd;
        const float* qh = q + base;
        const float* doh = dout + b * T * o_stride + h * hd;
        const float* lseh = lse + bh * T;
        const float* dlt = delta.data() + bh * T;
        float* dq_out = splits == 1 ? dq + base : dq_parts.data() + (split * BH + bh) * T * hd;
        const int64_t dq_stride = splits == 1 ? qkv_stride : hd;
        for (int64_t t0 = k0; t0 < t_end; t0 += kBq) {
          const int64_t t1 = std::min(t_end, t0 + kBq), nt = t1 - t0;
          const float* qt = qh + t0 * qkv_stride;
          const float* dot = doh + t0 * o_stride;
          // p = q k^T (unscaled), dp = dout v^T
          TileGemm(false, true, nt, nk, hd, 1.0f, qt, qkv_stride, kt, qkv_stride, 0.0f, p.data(),
                   kBk);
          TileGemm(false, true, nt, nk, hd, 1.0f, dot, o_stride, vt, qkv_stride, 0.0f, dp.data(),
                   kBk);
          for (int64_t r = 0; r < nt; ++r) {
            const int64_t t = t0 + r;
            float* pr = p.data() + r * kBk;
            float* dsr = dp.data() + r * kBk;  // dp becomes ds in place
            const int64_t lo = std::max<int64_t>(0, std::max(k0, FirstKey(s, t)) - k0);
            const int64_t hi = std::max<int64_t>(lo, std::min(k1 - 1, t) + 1 - k0);
            const float l = lseh[t], D = dlt[t];
            for (int64_t j = lo; j < hi; ++j) {
              const float pj = vec::Exp(pr[j] * scale - l);
              pr[j] = pj;
              dsr[j] = pj * (dsr[j] - D) * scale;
            }
            std::fill(pr, pr + lo, 0.0f);
            std::fill(pr + hi, pr + nk, 0.0f);
            std::fill(dsr, dsr + lo, 0.0f);
            std::fill(dsr + hi, dsr + nk, 0.0f);
          }
          // dv[k0:k1] += p^T dout[t0:t1];  dk[k0:k1] += ds^T q[t0:t1];  dq[t0:t1] += ds k[k0:k1]
          TileGemm(true, false, nk, hd, nt, 1.0f, p.data(), kBk, dot, o_stride, beta, dvt,
                   qkv_stride);
          TileGemm(true, false, nk, hd, nt, 1.0f, dp.data(), kBk, qt, qkv_stride, beta, dkt,
                   qkv_stride);
          TileGemm(false, false, nt, hd, nk, 1.0f, dp.data(), kBk, kt, qkv_stride, 1.0f,
                   dq_out + t0 * dq_stride, dq_stride);
          beta = 1.0f;
        }
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
