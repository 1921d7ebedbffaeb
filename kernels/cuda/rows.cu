// Row kernels, one block per row: RMSNorm forward/backward and row softmax forward/backward.
// Rows are read as float4 when C % 4 == 0 and the pointers are 16-byte aligned (the launchers
// check), else element by element. Block reductions have a fixed order: bitwise deterministic.
// Contracts: cuda_ops.h.
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace ember::kernels::cuda::detail {
namespace {

// Loads/stores V floats at element offset i of a row (V = 4: one float4).
template <int V> struct Vec;
template <> struct Vec<1> {
  using T = float;
  static __device__ __forceinline__ float Get(const T& v, int) { return v; }
  static __device__ __forceinline__ void Set(T& v, int, float x) { v = x; }
};
template <> struct Vec<4> {
  using T = float4;
  static __device__ __forceinline__ float Get(const T& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
  }
  static __device__ __forceinline__ void Set(T& v, int j, float x) {
    if (j == 0) v.x = x; else if (j == 1) v.y = x; else if (j == 2) v.z = x; else v.w = x;
  }
};

template <int V>
__global__ void RmsNormForwardKernel(const float* __restrict__ x, const float* __restrict__ w,
                                     int64_t C, float eps, float* __restrict__ y,
                                     float* __restrict__ rstd) {
  using T = typename Vec<V>::T;
  EMBER_SHARED(float, red, [32]);
  const int64_t row = blockIdx.x;
  const T* xr = reinterpret_cast<const T*>(x + row * C);
  const T* wv = reinterpret_cast<const T*>(w);
  T* yr = reinterpret_cast<T*>(y + row * C);
  const int64_t nv = C / V;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const T v = xr[i];
#pragma unroll
    for (int j = 0; j < V; ++j) ss += Vec<V>::Get(v, j) * Vec<V>::Get(v, j);
  }
  ss = BlockSum(ss, red);
  const float r = rsqrtf(ss / C + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const T v = xr[i], wi = wv[i];
    T o;
#pragma unroll
    for (int j = 0; j < V; ++j) Vec<V>::Set(o, j, Vec<V>::Get(v, j) * r * Vec<V>::Get(wi, j));
    yr[i] = o;
  }
}

template <int V>
__global__ void RmsNormBackwardDxKernel(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ rstd,
                                        const float* __restrict__ dy, int64_t C,
                                        float* __restrict__ dx) {
  using T = typename Vec<V>::T;
  EMBER_SHARED(float, red, [32]);
  const int64_t row = blockIdx.x;
  const T* xr = reinterpret_cast<const T*>(x + row * C);
  const T* dyr = reinterpret_cast<const T*>(dy + row * C);
  const T* wv = reinterpret_cast<const T*>(w);
  T* dxr = reinterpret_cast<T*>(dx + row * C);
  const int64_t nv = C / V;
  float gx = 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const T a = xr[i], g = dyr[i], wi = wv[i];
#pragma unroll
    for (int j = 0; j < V; ++j)
      gx += Vec<V>::Get(g, j) * Vec<V>::Get(wi, j) * Vec<V>::Get(a, j);
  }
  gx = BlockSum(gx, red);
  const float r = rstd[row];
  const float k = r * r * gx / C;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const T a = xr[i], g = dyr[i], wi = wv[i];
    T o;
#pragma unroll
    for (int j = 0; j < V; ++j)
      Vec<V>::Set(o, j, r * (Vec<V>::Get(g, j) * Vec<V>::Get(wi, j) - Vec<V>::Get(a, j) * k));
    dxr[i] = o;
  }
}

// partial[seg, c] = sum over the segment's rows, in order, of dy * x * rstd.
__global__ void RmsNormDwPartialKernel(const float* __restrict__ x, const float* __restrict__ rstd,
                                       const float* __restrict__ dy, int64_t N, int64_t C,
                                       int64_t rows_per_segment, float* __restrict__ partial) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t seg = blockIdx.y;
  if (c >= C) return;
  const int64_t n0 = seg * rows_per_segment;
  const int64_t n1 = min(N, n0 + rows_per_segment);
  float acc = 0;
  for (int64_t n = n0; n < n1; ++n) acc += dy[n * C + c] * x[n * C + c] * rstd[n];
  partial[seg * C + c] = acc;
}

// out[c] += sum over segments, in order, of partial[seg, c].
__global__ void ColumnFinishKernel(const float* __restrict__ partial, int64_t segments, int64_t C,
                                   float* __restrict__ out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float acc = 0;
  for (int64_t s = 0; s < segments; ++s) acc += partial[s * C + c];
  out[c] += acc;
}

// Two passes over the row: an online max/sum (one read), then exp(x - max) / sum (read + write).
template <int V>
__global__ void SoftmaxForwardKernel(const float* __restrict__ x, int64_t C,
                                     float* __restrict__ y) {
  using T = typename Vec<V>::T;
  EMBER_SHARED(float, red, [32]);
  const int64_t row = blockIdx.x;
  const T* xr = reinterpret_cast<const T*>(x + row * C);
  T* yr = reinterpret_cast<T*>(y + row * C);
  const int64_t nv = C / V;
  float m = -INFINITY, s = 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const T v = xr[i];
#pragma unroll
    for (int j = 0; j < V; ++j) OnlineAdd(Vec<V>::Get(v, j), m, s);
  }
  float S;
  const float M = BlockOnlineMerge(m, s, &S, red);
  const float inv = 1.0f / S;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const T v = xr[i];
    T o;
#pragma unroll
    for (int j = 0; j < V; ++j) Vec<V>::Set(o, j, expf(Vec<V>::Get(v, j) - M) * inv);
    yr[i] = o;
  }
}

// dx = y * (dy - sum(y * dy)); dx may alias dy (each thread reads its elements before the
// reduction's barrier and writes only them after it).
template <int V>
__global__ void SoftmaxBackwardKernel(const float* __restrict__ y, const float* dy, int64_t C,
                                      float* dx) {
  using T = typename Vec<V>::T;
  EMBER_SHARED(float, red, [32]);
  const int64_t row = blockIdx.x;
  const T* yr = reinterpret_cast<const T*>(y + row * C);
  const T* dyr = reinterpret_cast<const T*>(dy + row * C);
  T* dxr = reinterpret_cast<T*>(dx + row * C);
  const int64_t nv = C / V;
  float acc = 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const T a = yr[i], g = dyr[i];
#pragma unroll
    for (int j = 0; j < V; ++j) acc += Vec<V>::Get(a, j) * Vec<V>::Get(g, j);
  }
  const float dot = BlockSum(acc, red);
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const T a = yr[i], g = dyr[i];
    T o;
#pragma unroll
    for (int j = 0; j < V; ++j)
      Vec<V>::Set(o, j, Vec<V>::Get(a, j) * (Vec<V>::Get(g, j) - dot));
    dxr[i] = o;
  }
}

bool Aligned16(int64_t C, std::initializer_list<const void*> ps) {
  if (C % 4 != 0) return false;
  for (const void* p : ps)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

}  // namespace

cudaError_t RmsNormForward(const float* x, const float* w, int64_t N, int64_t C, float eps,
                           float* y, float* rstd, int block, cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  if (Aligned16(C, {x, w, y}))
    EMBER_LAUNCH(RmsNormForwardKernel<4>, N, block, 0, s)(x, w, C, eps, y, rstd);
  else
    EMBER_LAUNCH(RmsNormForwardKernel<1>, N, block, 0, s)(x, w, C, eps, y, rstd);
  return cudaGetLastError();
}

cudaError_t RmsNormBackward(const float* x, const float* w, const float* rstd, const float* dy,
                            int64_t N, int64_t C, float* dx, float* dw, float* partial,
                            int64_t segments, int64_t rows_per_segment, int block,
                            cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  if (Aligned16(C, {x, w, dy, dx}))
    EMBER_LAUNCH(RmsNormBackwardDxKernel<4>, N, block, 0, s)(x, w, rstd, dy, C, dx);
  else
    EMBER_LAUNCH(RmsNormBackwardDxKernel<1>, N, block, 0, s)(x, w, rstd, dy, C, dx);
  const dim3 grid((C + 255) / 256, segments);
  EMBER_LAUNCH(RmsNormDwPartialKernel, grid, 256, 0, s)(x, rstd, dy, N, C, rows_per_segment,
                                                       partial);
  EMBER_LAUNCH(ColumnFinishKernel, (C + 255) / 256, 256, 0, s)(partial, segments, C, dw);
  return cudaGetLastError();
}

cudaError_t SoftmaxForward(const float* x, int64_t N, int64_t C, float* y, int block,
                           cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  if (Aligned16(C, {x, y}))
    EMBER_LAUNCH(SoftmaxForwardKernel<4>, N, block, 0, s)(x, C, y);
  else
    EMBER_LAUNCH(SoftmaxForwardKernel<1>, N, block, 0, s)(x, C, y);
  return cudaGetLastError();
}

cudaError_t SoftmaxBackward(const float* y, const float* dy, int64_t N, int64_t C, float* dx,
                            int block, cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  if (Aligned16(C, {y, dy, dx}))
    EMBER_LAUNCH(SoftmaxBackwardKernel<4>, N, block, 0, s)(y, dy, C, dx);
  else
    EMBER_LAUNCH(SoftmaxBackwardKernel<1>, N, block, 0, s)(y, dy, C, dx);
  return cudaGetLastError();
}

}  // namespace ember::kernels::cuda::detail
