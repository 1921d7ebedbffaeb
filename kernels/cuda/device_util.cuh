// Device helpers shared by the .cu files: warp/block reductions with a fixed order (so results
// are bitwise identical run to run), bf16 bit conversions matching runtime/base/dtype.h, and
// grid-stride loops. Internal to //kernels/cuda.
#ifndef EMBER_KERNELS_CUDA_DEVICE_UTIL_CUH_
#define EMBER_KERNELS_CUDA_DEVICE_UTIL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

// A kernel launch: EMBER_LAUNCH(kernel, grid, block, smem, stream)(args...). Under nvcc the
// <<<...>>> launch; under the CPU interpreter (kernels/cuda/interp) its launcher, which
// cuda_interp.h defines.
#ifndef EMBER_LAUNCH
#define EMBER_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#endif

// Shared memory: arrays are declared EMBER_SHARED(type, name, dims), e.g.
// EMBER_SHARED(float, red, [32]), and pointers into them are SharedPtr<T> (T may be a row type,
// float[65]). Under nvcc these are `__shared__ float red[32]` and a plain T*; under the
// interpreter, checked arrays whose every access goes through its shared-memory race detector.
#ifndef EMBER_CUDA_INTERP
#define EMBER_SHARED(type, name, dims) __shared__ type name dims
#endif

namespace ember::kernels::cuda::detail {

#ifdef EMBER_CUDA_INTERP
template <typename T>
using SharedPtr = ::ember_interp::SharedPtr<T>;
#else
template <typename T>
using SharedPtr = T*;
#endif

#define EMBER_GRID_STRIDE(i, n)                                                         \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum / max; every thread gets the result. blockDim.x is a multiple of 32, <= 1024.
// `shared` holds 32 elements. Fixed tree order: deterministic.
template <typename T>
__device__ __forceinline__ T BlockSum(T v, SharedPtr<T> shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : T(0);
  return WarpSum(v);
}
__device__ __forceinline__ float BlockMax(float v, SharedPtr<float> shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : -INFINITY;
  return WarpMax(v);
}

// Online softmax statistics: folds e into (running max m, sum s of exp(x - m)).
__device__ __forceinline__ void OnlineAdd(float e, float& m, float& s) {
  if (e > m) {
    s = s * expf(m - e) + 1.0f;
    m = e;
  } else {
    s += expf(e - m);
  }
}
// Block-wide merge of every thread's (m, s): returns the row max M; *S gets sum exp(x - M).
__device__ __forceinline__ float BlockOnlineMerge(float m, float s, float* S,
                                                  SharedPtr<float> shared) {
  const float M = BlockMax(m, shared);
  *S = BlockSum(m == -INFINITY ? 0.0f : s * expf(m - M), shared);
  return M;
}

__device__ __forceinline__ float Bf16BitsToF32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
// Round to nearest even; NaN stays NaN with the quiet bit set (runtime/base/dtype.h F32ToBf16).
__device__ __forceinline__ uint16_t F32ToBf16Bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace ember::kernels::cuda::detail

#endif  // EMBER_KERNELS_CUDA_DEVICE_UTIL_CUH_
