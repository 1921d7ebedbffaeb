// Dense matrix multiply through OpenBLAS, split over the ExecContext's pool.
//
//   C[M,N] = alpha * op(A) @ op(B) + beta * C      (row-major; op(X) = X or X^T)
//
// A is [M,K] (or [K,M] when trans_a), B is [K,N] (or [N,K] when trans_b), lda/ldb/ldc are row
// strides in elements. OpenBLAS runs single-threaded inside each pool task, so the job has one
// pool. In deterministic mode the output is split into tiles chosen from the shape alone, so results
// do not depend on the pool size.
//
// Thread safety: the functions are reentrant; the calls must not overlap in C.
#ifndef EMBER_KERNELS_GEMM_H_
#define EMBER_KERNELS_GEMM_H_

#include <cstdint>

#include "kernels/exec_context.h"

namespace ember::kernels {

void Gemm(const ExecContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
          float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
          float* C, int64_t ldc);

// Same contract with bf16 inputs (raw uint16 bit patterns) and fp32 accumulation/output
// (OpenBLAS cblas_sbgemm when the linked library has it; otherwise the inputs are widened to fp32,
// which is exact, and sgemm runs).
void GemmBf16(const ExecContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
              float beta, float* C, int64_t ldc);

// True when the linked OpenBLAS exports cblas_sbgemm (Debian 0.3.21 does not).
bool HasNativeBf16Gemm();

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_GEMM_H_
