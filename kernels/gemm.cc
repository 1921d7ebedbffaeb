#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "kernels/cast.h"

// Debian's OpenBLAS 0.3.21 declares cblas_sbgemm but is built without BUILD_BFLOAT16, so the
// symbol is bound weakly and GemmBf16 falls back to widening to fp32 (exact) + sgemm.
#pragma weak cblas_sbgemm

namespace ember::kernels {
namespace {

void PinOpenBlasSingleThreaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Splits the larger output dimension into tiles and runs `fn(m0, m1, n0, n1)` per tile.
template <typename Fn>
void ForEachTile(const ExecContext& ctx, int64_t M, int64_t N, int64_t K, Fn fn) {
  const int threads = ctx.num_threads();
  const bool split_m = M >= N;
  const int64_t dim = split_m ? M : N;
  int64_t tile;
  if (static_cast<double>(M) * N * K < 64.0 * 64 * 64) {
    tile = dim;
  } else if (ctx.deterministic) {
    tile = std::max<int64_t>(64, (dim + 7) / 8);  // from the shape only
  } else {
    // Two tiles per thread: a descheduled thread's second tile is taken by the others.
    tile = std::max<int64_t>(64, (dim + 2 * threads - 1) / (2 * threads));
  }
  tile = (tile + 15) / 16 * 16;
  const int64_t tiles = (dim + tile - 1) / tile;
  auto run = [&](int64_t t) {
    int64_t b = t * tile, e = std::min(dim, b + tile);
    if (split_m) fn(b, e, 0, N); else fn(0, M, b, e);
  };
  if (tiles == 1 || ctx.pool == nullptr) {
    for (int64_t t = 0; t < tiles; ++t) run(t);
  } else {
    ctx.pool->Run(tiles, run);
  }
}

template <typename T>
const T* OffsetA(const T* A, bool trans_a, int64_t lda, int64_t m0) {
  return trans_a ? A + m0 : A + m0 * lda;
}
template <typename T>
const T* OffsetB(const T* B, bool trans_b, int64_t ldb, int64_t n0) {
  return trans_b ? B + n0 * ldb : B + n0;
}

}  // namespace

void Gemm(const ExecContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
          float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
          float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  PinOpenBlasSingleThreaded();
  ForEachTile(ctx, M, N, K, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m1 - m0, n1 - n0, K, alpha,
                OffsetA(A, trans_a, lda, m0), lda, OffsetB(B, trans_b, ldb, n0), ldb, beta,
                C + m0 * ldc + n0, ldc);
  });
}

bool HasNativeBf16Gemm() { return &cblas_sbgemm != nullptr; }

void GemmBf16(const ExecContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
              float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  PinOpenBlasSingleThreaded();
  if (!HasNativeBf16Gemm()) {
    // bf16 -> fp32 is exact, so this is the same math, without the bandwidth saving.
    const int64_t a_rows = trans_a ? K : M, b_rows = trans_b ? N : K;
    std::vector<float> a(a_rows * lda), b(b_rows * ldb);
    CastBf16ToF32(ctx, A, a.data(), a.size());
    CastBf16ToF32(ctx, B, b.data(), b.size());
    Gemm(ctx, trans_a, trans_b, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, C, ldc);
    return;
  }
  ForEachTile(ctx, M, N, K, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    cblas_sbgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                 trans_b ? CblasTrans : CblasNoTrans, m1 - m0, n1 - n0, K, alpha,
                 reinterpret_cast<const bfloat16*>(OffsetA(A, trans_a, lda, m0)), lda,
                 reinterpret_cast<const bfloat16*>(OffsetB(B, trans_b, ldb, n0)), ldb, beta,
                 C + m0 * ldc + n0, ldc);
  });
}

}  // namespace ember::kernels
