// Causal attention with an optional sliding window, flash-style (no T x T matrix), fp32, for head
// sizes 32 and 64. Contract: kernels/attention.h (same layout, strides, lse). Key tiles outside
// the causal band / window are never visited. Backward: one kernel per query tile for dq and one
// per key tile for dk/dv, each summing in a fixed order: bitwise deterministic, no atomics.
//
// Grouped-query attention (KV key/value heads, group = H / KV query heads each): query head h
// reads kv head h / group. Forward and dq blocks are per (batch, query head, query tile) and only
// read k/v. A dk/dv block is per (batch, kv head, key tile): it loops over the group's query heads
// in head order inside the block, accumulating in its own registers/shared row, so no two blocks
// write one dk/dv row and no atomics are needed (deterministic, like the CPU's head-order sum).
//
// A straightforward CUDA-core version (one thread per query or key row, tiles in shared memory);
// no tensor cores, so far below the H200's attention peak. NEVER RUN ON A GPU: neither the MHA
// kernels nor the GQA paths have executed; attention_test.cc checks both against the CPU kernel
// on a GPU machine (tests/gpu/cuda_kernels.sh). What did run, once, by hand: this file's code
// compiled for the host (launches rewritten to loops over blocks, each CUDA thread a std::thread,
// __syncthreads a std::barrier, exact-size buffers under ASan, UBSan too for hd 32) on
// attention_test's GQA shapes: every output within 1.1e-6 of the CPU kernel. That covers index arithmetic, bounds and
// barrier placement; not CUDA's expf, the launch limits, the warp scheduler or the memory model.
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace ember::kernels::cuda::detail {
namespace {

constexpr int kRows = 32;  // query rows per block (forward, dq) and key rows per block (dk/dv)
constexpr int kTile = 32;  // keys (forward, dq) or queries (dk/dv) per shared tile

__host__ __device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }
__host__ __device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

struct Geo {
  int64_t T, H, KV, group, stride, o_stride, window;  // group = H / KV
  float scale;
};

__device__ __forceinline__ int64_t FirstKey(const Geo& g, int64_t t) {
  return g.window > 0 ? Max64(0, t - g.window + 1) : 0;
}
// Last query that sees key j.
__device__ __forceinline__ int64_t LastQuery(const Geo& g, int64_t j) {
  return g.window > 0 ? Min64(g.T - 1, j + g.window - 1) : g.T - 1;
}

// Loads rows [r0, r0 + kTile) of a [T, stride] head view into sh[kTile][HD + 1] (zeros past T).
template <int HD>
__device__ __forceinline__ void LoadTile(const float* __restrict__ src, int64_t r0, const Geo& g,
                                         int64_t stride, SharedPtr<float[HD + 1]> sh) {
  for (int i = threadIdx.x; i < kTile * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD;
    sh[r][d] = r0 + r < g.T ? src[(r0 + r) * stride + d] : 0.0f;
  }
}

template <int HD>
__global__ void __launch_bounds__(kRows) ForwardKernel(const float* __restrict__ q,
                                                       const float* __restrict__ k,
                                                       const float* __restrict__ v, Geo g,
                                                       float* __restrict__ o,
                                                       float* __restrict__ lse) {
  EMBER_SHARED(float, Ks, [kTile][HD + 1]);
  EMBER_SHARED(float, Vs, [kTile][HD + 1]);
  const int64_t bh = blockIdx.y, b = bh / g.H, h = bh % g.H;
  const int64_t base = b * g.T * g.stride + h * HD;
  const int64_t kv_base = b * g.T * g.stride + h / g.group * HD;
  const float *qh = q + base, *kh = k + kv_base, *vh = v + kv_base;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kRows, t = q0 + threadIdx.x;
  const bool live = t < g.T;
  float qr[HD], acc[HD];
#pragma unroll
  for (int d = 0; d < HD; ++d) {
    qr[d] = live ? qh[t * g.stride + d] * g.scale : 0.0f;
    acc[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t q_last = Min64(g.T, q0 + kRows) - 1;
  const int64_t k_first = FirstKey(g, q0) / kTile * kTile;
  for (int64_t k0 = k_first; k0 <= q_last; k0 += kTile) {
    __syncthreads();
    LoadTile<HD>(kh, k0, g, g.stride, Ks);
    LoadTile<HD>(vh, k0, g, g.stride, Vs);
    __syncthreads();
    if (!live) continue;
    const int64_t lo = Max64(k0, FirstKey(g, t)), hi = Min64(k0 + kTile - 1, t);
    for (int64_t j = lo; j <= hi; ++j) {
      SharedPtr<const float> kr = Ks[j - k0];
      float s = 0.0f;
#pragma unroll
      for (int d = 0; d < HD; ++d) s += qr[d] * kr[d];
      if (s > m) {
        const float corr = expf(m - s);
        l *= corr;
#pragma unroll
        for (int d = 0; d < HD; ++d) acc[d] *= corr;
        m = s;
      }
      const float p = expf(s - m);
      l += p;
      SharedPtr<const float> vr = Vs[j - k0];
#pragma unroll
      for (int d = 0; d < HD; ++d) acc[d] += p * vr[d];
    }
  }
  if (!live) return;
  const float inv = 1.0f / l;
  float* orow = o + b * g.T * g.o_stride + h * HD + t * g.o_stride;
#pragma unroll
  for (int d = 0; d < HD; ++d) orow[d] = acc[d] * inv;
  lse[bh * g.T + t] = m + logf(l);
}

// delta[bh, t] = dout[t] . o[t]
template <int HD>
__global__ void DeltaKernel(const float* __restrict__ o, const float* __restrict__ dout, Geo g,
                            int64_t BH, float* __restrict__ delta) {
  EMBER_GRID_STRIDE(i, BH * g.T) {
    const int64_t bh = i / g.T, t = i % g.T, b = bh / g.H, h = bh % g.H;
    const int64_t off = (b * g.T + t) * g.o_stride + h * HD;
    float s = 0.0f;
    for (int d = 0; d < HD; ++d) s += o[off + d] * dout[off + d];
    delta[i] = s;
  }
}

template <int HD>
__global__ void __launch_bounds__(kRows) DqKernel(const float* __restrict__ q,
                                                  const float* __restrict__ k,
                                                  const float* __restrict__ v,
                                                  const float* __restrict__ dout,
                                                  const float* __restrict__ lse,
                                                  const float* __restrict__ delta, Geo g,
                                                  float* __restrict__ dq) {
  EMBER_SHARED(float, Ks, [kTile][HD + 1]);
  EMBER_SHARED(float, Vs, [kTile][HD + 1]);
  EMBER_SHARED(float, dOs, [kRows][HD + 1]);
  EMBER_SHARED(float, Qs, [kRows][HD + 1]);
  const int64_t bh = blockIdx.y, b = bh / g.H, h = bh % g.H;
  const int64_t base = b * g.T * g.stride + h * HD;
  const int64_t kv_base = b * g.T * g.stride + h / g.group * HD;
  const int64_t obase = b * g.T * g.o_stride + h * HD;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kRows, t = q0 + threadIdx.x;
  const bool live = t < g.T;
  LoadTile<HD>(dout + obase, q0, g, g.o_stride, dOs);
  LoadTile<HD>(q + base, q0, g, g.stride, Qs);  // unscaled; s is scaled below
  float acc[HD];  // q and dout rows stay in shared memory (registers would spill at hd 64)
#pragma unroll
  for (int d = 0; d < HD; ++d) acc[d] = 0.0f;
  SharedPtr<const float> qr = Qs[threadIdx.x];
  const float L = live ? lse[bh * g.T + t] : 0.0f, D = live ? delta[bh * g.T + t] : 0.0f;
  SharedPtr<const float> dor = dOs[threadIdx.x];
  const int64_t q_last = Min64(g.T, q0 + kRows) - 1;
  const int64_t k_first = FirstKey(g, q0) / kTile * kTile;
  for (int64_t k0 = k_first; k0 <= q_last; k0 += kTile) {
    __syncthreads();
    LoadTile<HD>(k + kv_base, k0, g, g.stride, Ks);
    LoadTile<HD>(v + kv_base, k0, g, g.stride, Vs);
    __syncthreads();
    if (!live) continue;
    const int64_t lo = Max64(k0, FirstKey(g, t)), hi = Min64(k0 + kTile - 1, t);
    for (int64_t j = lo; j <= hi; ++j) {
      SharedPtr<const float> kr = Ks[j - k0], vr = Vs[j - k0];
      float s = 0.0f, dp = 0.0f;
#pragma unroll 8
      for (int d = 0; d < HD; ++d) {
        s += qr[d] * kr[d];
        dp += dor[d] * vr[d];
      }
      const float ds = expf(s * g.scale - L) * (dp - D) * g.scale;
#pragma unroll 8
      for (int d = 0; d < HD; ++d) acc[d] += ds * kr[d];
    }
  }
  if (!live) return;
#pragma unroll
  for (int d = 0; d < HD; ++d) dq[base + t * g.stride + d] = acc[d];
}

// Block (key tile, b * KV + kv head). Thread j owns key row j of the kv head: dk/dv summed over
// the group's query heads in head order, then over query tiles in order.
template <int HD>
__global__ void __launch_bounds__(kRows) DkDvKernel(const float* __restrict__ q,
                                                    const float* __restrict__ k,
                                                    const float* __restrict__ v,
                                                    const float* __restrict__ dout,
                                                    const float* __restrict__ lse,
                                                    const float* __restrict__ delta, Geo g,
                                                    float* __restrict__ dk,
                                                    float* __restrict__ dv) {
  EMBER_SHARED(float, Qs, [kTile][HD + 1]);
  EMBER_SHARED(float, dOs, [kTile][HD + 1]);
  EMBER_SHARED(float, Ks, [kRows][HD + 1]);
  EMBER_SHARED(float, Vs, [kRows][HD + 1]);
  // dKs[threadIdx.x] is this thread's dk row (registers would spill at hd 64).
  EMBER_SHARED(float, dKs, [kRows][HD + 1]);
  EMBER_SHARED(float, Ls, [kTile]);
  EMBER_SHARED(float, Ds, [kTile]);
  const int64_t bkv = blockIdx.y, b = bkv / g.KV, kvh = bkv % g.KV;
  const int64_t kv_base = b * g.T * g.stride + kvh * HD;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kRows, j = j0 + threadIdx.x;
  const bool live = j < g.T;
  LoadTile<HD>(k + kv_base, j0, g, g.stride, Ks);  // read after the first barrier below
  LoadTile<HD>(v + kv_base, j0, g, g.stride, Vs);
  float dvr[HD];
  SharedPtr<float> dkr = dKs[threadIdx.x];
#pragma unroll
  for (int d = 0; d < HD; ++d) dkr[d] = dvr[d] = 0.0f;
  SharedPtr<const float> kr = Ks[threadIdx.x], vr = Vs[threadIdx.x];
  const int64_t j_last = Min64(g.T, j0 + kRows) - 1;
  const int64_t t_first = j0 / kTile * kTile;
  const int64_t t_last = LastQuery(g, j_last);
  // Loop bounds depend on the block only, so every thread reaches every barrier.
  for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
    const int64_t bh = b * g.H + h;
    const int64_t base = b * g.T * g.stride + h * HD;
    const int64_t obase = b * g.T * g.o_stride + h * HD;
    for (int64_t t0 = t_first; t0 <= t_last; t0 += kTile) {
      __syncthreads();  // the previous tile's Qs/dOs/Ls/Ds are no longer read
      LoadTile<HD>(q + base, t0, g, g.stride, Qs);
      LoadTile<HD>(dout + obase, t0, g, g.o_stride, dOs);
      for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
        Ls[i] = t0 + i < g.T ? lse[bh * g.T + t0 + i] : 0.0f;
        Ds[i] = t0 + i < g.T ? delta[bh * g.T + t0 + i] : 0.0f;
      }
      __syncthreads();
      if (!live) continue;
      const int64_t lo = Max64(t0, j), hi = Min64(t0 + kTile - 1, LastQuery(g, j));
      for (int64_t t = lo; t <= hi; ++t) {
        SharedPtr<const float> qr = Qs[t - t0], dor = dOs[t - t0];
        float s = 0.0f, dp = 0.0f;
#pragma unroll 8
        for (int d = 0; d < HD; ++d) {
          s += qr[d] * kr[d];
          dp += dor[d] * vr[d];
        }
        const float p = expf(s * g.scale - Ls[t - t0]);
        const float ds = p * (dp - Ds[t - t0]) * g.scale;
#pragma unroll 8
        for (int d = 0; d < HD; ++d) {
          dvr[d] += p * dor[d];
          dkr[d] += ds * qr[d];
        }
      }
    }
  }
  if (!live) return;
#pragma unroll
  for (int d = 0; d < HD; ++d) {
    dk[kv_base + j * g.stride + d] = dkr[d];
    dv[kv_base + j * g.stride + d] = dvr[d];
  }
}

Geo MakeGeo(const AttentionDims& s) {
  return Geo{s.T,          s.H,        s.KV,     s.H / s.KV,
             s.qkv_stride, s.o_stride, s.window, 1.0f / sqrtf(static_cast<float>(s.hd))};
}

template <int HD>
void Forward(const AttentionDims& s, const float* q, const float* k, const float* v, float* o,
             float* lse, cudaStream_t st) {
  const dim3 grid((s.T + kRows - 1) / kRows, s.B * s.H);
  EMBER_LAUNCH(ForwardKernel<HD>, grid, kRows, 0, st)(q, k, v, MakeGeo(s), o, lse);
}

template <int HD>
void Backward(const AttentionDims& s, const float* q, const float* k, const float* v,
              const float* o, const float* dout, const float* lse, float* delta, float* dq,
              float* dk, float* dv, cudaStream_t st) {
  const Geo g = MakeGeo(s);
  const int64_t rows = s.B * s.H * s.T;
  EMBER_LAUNCH(DeltaKernel<HD>, Min64((rows + 255) / 256, 65535), 256, 0, st)(o, dout, g,
                                                                                s.B * s.H, delta);
  const dim3 grid((s.T + kRows - 1) / kRows, s.B * s.H);
  EMBER_LAUNCH(DqKernel<HD>, grid, kRows, 0, st)(q, k, v, dout, lse, delta, g, dq);
  const dim3 kv_grid((s.T + kRows - 1) / kRows, s.B * s.KV);
  EMBER_LAUNCH(DkDvKernel<HD>, kv_grid, kRows, 0, st)(q, k, v, dout, lse, delta, g, dk, dv);
}

}  // namespace

bool AttentionSupportsHeadDim(int64_t hd) { return hd == 32 || hd == 64; }

cudaError_t AttentionForward(const AttentionDims& s, const float* q, const float* k,
                             const float* v, float* o, float* lse, cudaStream_t st) {
  if (s.B * s.H * s.T <= 0) return cudaGetLastError();
  if (s.KV < 1 || s.H % s.KV != 0) return cudaErrorInvalidValue;
  if (s.hd == 32) Forward<32>(s, q, k, v, o, lse, st);
  else if (s.hd == 64) Forward<64>(s, q, k, v, o, lse, st);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t AttentionBackward(const AttentionDims& s, const float* q, const float* k,
                              const float* v, const float* o, const float* dout, const float* lse,
                              float* delta, float* dq, float* dk, float* dv, cudaStream_t st) {
  if (s.B * s.H * s.T <= 0) return cudaGetLastError();
  if (s.KV < 1 || s.H % s.KV != 0) return cudaErrorInvalidValue;
  if (s.hd == 32) Backward<32>(s, q, k, v, o, dout, lse, delta, dq, dk, dv, st);
  else if (s.hd == 64) Backward<64>(s, q, k, v, o, dout, lse, delta, dq, dk, dv, st);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace ember::kernels::cuda::detail
