// Dense matrix multiply through OpenBLAS (fp32) and oneDNN (bf16), split over the ExecContext's
// pool.
//
//   C[M,N] = alpha * op(A) @ op(B) + beta * C      (row-major; op(X) = X or X^T)
//
// A is [M,K] (or [K,M] when trans_a), B is [K,N] (or [N,K] when trans_b), lda/ldb/ldc are row
// strides in elements. OpenBLAS and oneDNN run single-threaded inside each pool task (oneDNN's
// OpenMP thread count is set to 1 in every thread that calls it), so the job has one pool. In
// deterministic mode the output is split into tiles chosen from the shape alone, so results do not
// depend on the pool size (GemmBf16 included: one tile is one single-threaded oneDNN matmul, whose
// summation order depends on the tile's shape and the CPU's ISA only).
//
// Thread safety: the functions are reentrant; the calls must not overlap in C. The oneDNN
// primitives are created on first use of a tile shape and cached for the life of the process,
// never pruned (a mutex-guarded map; a model has a few dozen tile shapes, each primitive a few KiB
// plus its jit code; each thread executes them with its own stream and scratchpad).
#ifndef EMBER_KERNELS_GEMM_H_
#define EMBER_KERNELS_GEMM_H_

#include <cstdint>
#include <string>

#include "kernels/exec_context.h"

namespace ember::kernels {

void Gemm(const ExecContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
          float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
          float* C, int64_t ldc);

// Same contract with bf16 inputs (raw uint16 bit patterns) and fp32 accumulation/output. Where
// HasNativeBf16Gemm(): oneDNN's bf16 matmul (products exact in fp32, fp32 sums in an order of
// oneDNN's choosing). Elsewhere the inputs are widened to fp32 (exact) and OpenBLAS sgemm runs:
// the same math up to summation order, at fp32 speed.
void GemmBf16(const ExecContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
              float beta, float* C, int64_t ldc);

// Which path GemmBf16 takes in this process, decided once at first use (run-time dispatch): native
// when the CPU has avx512_bf16 or AMX-BF16 (cpuid, with the OS enabling AVX-512 state), oneDNN's
// effective ISA includes avx512_core_bf16 and it offers a jit (not reference) bf16 matmul, and
// $EMBER_BF16_GEMM is not "off" (forces the widening path, for comparisons and tests).
struct Bf16GemmSupport {
  bool native = false;    // GemmBf16 runs oneDNN bf16 kernels
  bool cpu_bf16 = false;  // the CPU has bf16 instructions (even where native is false)
  std::string cpu;        // /proc/cpuinfo's model name
  std::string reason;     // one line: the path and why ("oneDNN 2.6 bf16 matmul (brg:...) on ...")
};
const Bf16GemmSupport& Bf16GemmInfo();

// Bf16GemmInfo().native.
bool HasNativeBf16Gemm();

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_GEMM_H_
