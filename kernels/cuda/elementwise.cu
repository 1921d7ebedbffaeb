// Elementwise kernels: casts, GELU (tanh), SwiGLU, residual add, embedding forward/backward. Contracts: cuda_ops.h
// (the same as kernels/ops.h and kernels/cast.h on CPU).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace ember::kernels::cuda::detail {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;

__global__ void CastF32ToBf16Kernel(const float* __restrict__ in, uint16_t* __restrict__ out,
                                    int64_t n) {
  EMBER_GRID_STRIDE(i, n) out[i] = F32ToBf16Bits(in[i]);
}
__global__ void CastBf16ToF32Kernel(const uint16_t* __restrict__ in, float* __restrict__ out,
                                    int64_t n) {
  EMBER_GRID_STRIDE(i, n) out[i] = Bf16BitsToF32(in[i]);
}

__device__ __forceinline__ float GeluTanhArg(float v) {
  return kSqrt2OverPi * (v + 0.044715f * v * v * v);
}
__global__ void GeluForwardKernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  EMBER_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(GeluTanhArg(v)));
  }
}
__global__ void GeluBackwardKernel(const float* __restrict__ x, const float* __restrict__ dy,
                                   float* __restrict__ dx, int64_t n) {
  EMBER_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float t = tanhf(GeluTanhArg(v));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

__device__ __forceinline__ float Sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }
__global__ void SwiGluForwardKernel(const float* __restrict__ x, int64_t N, int64_t F,
                                    float* __restrict__ y) {
  EMBER_GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i - n * F;
    const float a = x[n * 2 * F + f], g = x[n * 2 * F + F + f];
    y[i] = a * Sigmoid(a) * g;
  }
}
__global__ void SwiGluBackwardKernel(const float* __restrict__ x, const float* __restrict__ dy,
                                     int64_t N, int64_t F, float* __restrict__ dx) {
  EMBER_GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i - n * F;
    const float a = x[n * 2 * F + f], g = x[n * 2 * F + F + f];
    const float s = Sigmoid(a);
    dx[n * 2 * F + F + f] = dy[i] * a * s;
    dx[n * 2 * F + f] = dy[i] * g * s * (1.0f + a * (1.0f - s));
  }
}

__global__ void EmbeddingForwardKernel(const int32_t* __restrict__ ids, int64_t N,
                                       const float* __restrict__ table, int64_t C,
                                       float* __restrict__ out, bool accumulate) {
  EMBER_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i - n * C;
    const float v = table[static_cast<int64_t>(ids[n]) * C + c];
    out[i] = accumulate ? out[i] + v : v;
  }
}
// Thread c owns column c of every table row and walks the tokens in order: deterministic and
// atomic-free (the CPU reference's order). Parallelism is C threads.
__global__ void EmbeddingBackwardKernel(const int32_t* __restrict__ ids, int64_t N,
                                        const float* __restrict__ dout, int64_t C,
                                        float* __restrict__ dtable) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t n = 0; n < N; ++n) dtable[static_cast<int64_t>(ids[n]) * C + c] += dout[n * C + c];
}

__global__ void AddKernel(const float* a, const float* b, float* out, int64_t n) {
  EMBER_GRID_STRIDE(i, n) out[i] = a[i] + b[i];  // out may alias a or b: no __restrict__
}

constexpr int kBlock = 256;

}  // namespace

cudaError_t Add(const float* a, const float* b, float* out, int64_t n, int64_t grid,
                cudaStream_t s) {
  if (grid > 0) EMBER_LAUNCH(AddKernel, grid, kBlock, 0, s)(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t CastF32ToBf16(const float* in, uint16_t* out, int64_t n, int64_t grid,
                          cudaStream_t s) {
  if (grid > 0) EMBER_LAUNCH(CastF32ToBf16Kernel, grid, kBlock, 0, s)(in, out, n);
  return cudaGetLastError();
}
cudaError_t CastBf16ToF32(const uint16_t* in, float* out, int64_t n, int64_t grid,
                          cudaStream_t s) {
  if (grid > 0) EMBER_LAUNCH(CastBf16ToF32Kernel, grid, kBlock, 0, s)(in, out, n);
  return cudaGetLastError();
}
cudaError_t GeluForward(const float* x, float* y, int64_t n, int64_t grid, cudaStream_t s) {
  if (grid > 0) EMBER_LAUNCH(GeluForwardKernel, grid, kBlock, 0, s)(x, y, n);
  return cudaGetLastError();
}
cudaError_t GeluBackward(const float* x, const float* dy, float* dx, int64_t n, int64_t grid,
                         cudaStream_t s) {
  if (grid > 0) EMBER_LAUNCH(GeluBackwardKernel, grid, kBlock, 0, s)(x, dy, dx, n);
  return cudaGetLastError();
}
cudaError_t SwiGluForward(const float* x, int64_t N, int64_t F, float* y, int64_t grid,
                          cudaStream_t s) {
  if (grid > 0) EMBER_LAUNCH(SwiGluForwardKernel, grid, kBlock, 0, s)(x, N, F, y);
  return cudaGetLastError();
}
cudaError_t SwiGluBackward(const float* x, const float* dy, int64_t N, int64_t F, float* dx,
                           int64_t grid, cudaStream_t s) {
  if (grid > 0) EMBER_LAUNCH(SwiGluBackwardKernel, grid, kBlock, 0, s)(x, dy, N, F, dx);
  return cudaGetLastError();
}
cudaError_t EmbeddingForward(const int32_t* ids, int64_t N, const float* table, int64_t C,
                             float* out, bool accumulate, int64_t grid, cudaStream_t s) {
  if (grid > 0)
    EMBER_LAUNCH(EmbeddingForwardKernel, grid, kBlock, 0, s)(ids, N, table, C, out, accumulate);
  return cudaGetLastError();
}
cudaError_t EmbeddingBackward(const int32_t* ids, int64_t N, const float* dout, int64_t C,
                              float* dtable, cudaStream_t s) {
  if (N > 0 && C > 0)
    EMBER_LAUNCH(EmbeddingBackwardKernel, (C + kBlock - 1) / kBlock, kBlock, 0, s)(ids, N, dout, C,
                                                                                   dtable);
  return cudaGetLastError();
}

}  // namespace ember::kernels::cuda::detail
