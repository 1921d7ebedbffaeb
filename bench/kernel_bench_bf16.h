// kernel_bench's bf16 GEMM figures (issue 37, target 5): the linear-layer GEMMs of the tiny GPT and
// Llama training steps (the shapes kernel_bench's step figures train: forward x @ W^T, backward
// dy @ W and dy^T @ x for every linear of a block) in bf16 (kernels::GemmBf16: oneDNN, fp32
// accumulation) against fp32 (kernels::Gemm: OpenBLAS sgemm), same pool, same threads, timed
// interleaved (fp32, bf16, bf16, fp32 per round) so load from other work hits both sides alike.
// The goal (bf16 >= 1.6x fp32 over a step's GEMMs) applies where the CPU has bf16 instructions;
// elsewhere GemmBf16 widens to fp32 and the rows are informational, saying so. Every row names
// the CPU (/proc/cpuinfo).
#ifndef EMBER_BENCH_KERNEL_BENCH_BF16_H_
#define EMBER_BENCH_KERNEL_BENCH_BF16_H_

#include <vector>

#include "bench/kernel_bench_cuda.h"
#include "kernels/exec_context.h"

namespace ember::bench {

// Per model: one row per GEMM shape (informational: bf16 vs fp32 GFLOP/s), one row over all the
// step's linear GEMMs (the target), and one row through LinearForward/LinearBackward with
// ExecContext::bf16_linear on vs off (the casts to bf16 included; informational).
std::vector<KernelFigure> BenchBf16Gemm(const kernels::ExecContext& ctx, bool quick, int reps);

}  // namespace ember::bench

#endif  // EMBER_BENCH_KERNEL_BENCH_BF16_H_
