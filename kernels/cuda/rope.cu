// Rotary position embeddings (RoPE) in place, kernels/rope.h's interleaved-pair convention and
// layout, with the host's precomputed cos/sin table (kernels::MakeRopeTable, Llama 3.1 frequency
// rule included) read from device memory. One thread per (row, head, pair), grid-stride.
//
// Every product and sum is rounded on its own (__fmul_rn / __fadd_rn / __fsub_rn are never
// contracted into FMAs), in the CPU's order, so the result is bitwise the CPU's RotateRows (built
// with fp-contract=off) on the same table. Elementwise: deterministic.
//
// NEVER RUN ON A GPU: compiled for sm_75/sm_80/sm_90 (+PTX) only; rope_test.cc checks it against
// the CPU on a GPU machine (tests/gpu/cuda_kernels.sh). Run once by hand as host code (each CUDA
// thread a host thread, under ASan/UBSan) on rope_test's shapes: bitwise the CPU's.
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace ember::kernels::cuda::detail {
namespace {

// x rows (b, t) at x + (b*T + t) * stride, `heads` heads of 2*half floats each; table rows
// [t * half, (t + 1) * half). n = B * T * heads * half pairs. sign: +1 forward, -1 backward.
__global__ void RopeKernel(const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                           float* __restrict__ x, int64_t T, int64_t heads, int64_t half,
                           int64_t stride, int64_t n, float sign) {
  EMBER_GRID_STRIDE(i, n) {
    const int64_t pair = i % half, rest = i / half;
    const int64_t h = rest % heads, r = rest / heads, t = r % T;
    float* p = x + r * stride + h * 2 * half + 2 * pair;
    const float c = cos_t[t * half + pair], s = __fmul_rn(sign, sin_t[t * half + pair]);
    const float x0 = p[0], x1 = p[1];
    p[0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    p[1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

}  // namespace

cudaError_t Rope(const float* cos_t, const float* sin_t, float* x, int64_t B, int64_t T,
                 int64_t heads, int64_t hd, int64_t stride, float sign, int64_t grid,
                 cudaStream_t s) {
  const int64_t half = hd / 2, n = B * T * heads * half;
  if (n <= 0) return cudaGetLastError();
  EMBER_LAUNCH(RopeKernel, grid, 256, 0, s)(cos_t, sin_t, x, T, heads, half, stride, n, sign);
  return cudaGetLastError();
}

}  // namespace ember::kernels::cuda::detail
