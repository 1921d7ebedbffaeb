// Multi-tensor AdamW, deterministic global L2 norm and gradient clipping (apex-style batches:
// one block per (tensor, chunk), the tensor list in the kernel parameters). Contracts: cuda_ops.h.
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace ember::kernels::cuda::detail {
namespace {

constexpr int kBlock = 512;

__global__ void AdamWKernel(const __grid_constant__ TensorBatchArgs b, AdamWArgs a) {
  const int t = b.chunk_tensor[blockIdx.x];
  const int64_t begin = b.chunk_index[blockIdx.x] * b.chunk;
  const int64_t end = min(b.n[t], begin + b.chunk);
  float* __restrict__ p = b.p[t];
  const float* __restrict__ g = b.g[t];
  float* __restrict__ m = b.m[t];
  float* __restrict__ v = b.v[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float gi = g[i];
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) * a.inv_sqrt_bc2 + a.eps;
    p[i] = p[i] * a.decay - a.step_size * mi / denom;
  }
}

__global__ void SumSquaresKernel(const __grid_constant__ TensorBatchArgs b,
                                 double* __restrict__ partial) {
  EMBER_SHARED(double, red, [32]);
  const int t = b.chunk_tensor[blockIdx.x];
  const int64_t begin = b.chunk_index[blockIdx.x] * b.chunk;
  const int64_t end = min(b.n[t], begin + b.chunk);
  const float* __restrict__ p = b.p[t];
  double acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double x = p[i];
    acc += x * x;
  }
  acc = BlockSum(acc, red);
  if (threadIdx.x == 0) partial[b.first_chunk + blockIdx.x] = acc;
}

// One block: each thread sums a strided subset in order, then a fixed tree.
__global__ void FinishNormKernel(const double* __restrict__ partial, int64_t n, double max_norm,
                                 double* __restrict__ out_norm, float* __restrict__ scale) {
  EMBER_SHARED(double, red, [32]);
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = BlockSum(acc, red);
  if (threadIdx.x == 0) {
    const double norm = sqrt(acc);
    out_norm[0] = norm;
    if (scale != nullptr)
      scale[0] = (max_norm > 0 && norm > max_norm) ? static_cast<float>(max_norm / (norm + 1e-6))
                                                   : 1.0f;
  }
}

__global__ void ScaleKernel(const __grid_constant__ TensorBatchArgs b,
                            const float* __restrict__ scale) {
  const float k = scale[0];
  if (k == 1.0f) return;
  const int t = b.chunk_tensor[blockIdx.x];
  const int64_t begin = b.chunk_index[blockIdx.x] * b.chunk;
  const int64_t end = min(b.n[t], begin + b.chunk);
  float* __restrict__ p = b.p[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) p[i] *= k;
}

}  // namespace

cudaError_t AdamW(const TensorBatchArgs& b, const AdamWArgs& a, cudaStream_t s) {
  if (b.num_chunks > 0) EMBER_LAUNCH(AdamWKernel, b.num_chunks, kBlock, 0, s)(b, a);
  return cudaGetLastError();
}
cudaError_t SumSquares(const TensorBatchArgs& b, double* partial, cudaStream_t s) {
  if (b.num_chunks > 0) EMBER_LAUNCH(SumSquaresKernel, b.num_chunks, kBlock, 0, s)(b, partial);
  return cudaGetLastError();
}
cudaError_t FinishNorm(const double* partial, int64_t n, double max_norm, double* out_norm,
                       float* scale, cudaStream_t s) {
  EMBER_LAUNCH(FinishNormKernel, 1, 1024, 0, s)(partial, n, max_norm, out_norm, scale);
  return cudaGetLastError();
}
cudaError_t ScaleBy(const TensorBatchArgs& b, const float* scale, cudaStream_t s) {
  if (b.num_chunks > 0) EMBER_LAUNCH(ScaleKernel, b.num_chunks, kBlock, 0, s)(b, scale);
  return cudaGetLastError();
}

}  // namespace ember::kernels::cuda::detail
