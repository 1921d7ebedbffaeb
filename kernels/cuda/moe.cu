// MoE routing (top-k + softmax over the chosen logits) and the stable by-expert permutation.
// Contract: kernels/moe.h. Deterministic (no atomics). Never run on a GPU yet.
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace ember::kernels::cuda::detail {
namespace {

constexpr int kMaxK = 8;

// One thread per token: k passes of argmax over the experts not yet taken (ties: lower index).
__global__ void RouteKernel(const float* __restrict__ logits, int64_t N, int64_t E, int k,
                            int32_t* __restrict__ expert, float* __restrict__ weight) {
  EMBER_GRID_STRIDE(n, N) {
    const float* row = logits + n * E;
    int32_t chosen[kMaxK];
    float w[kMaxK];
    float sum = 0;
    for (int i = 0; i < k; ++i) {
      int64_t best = -1;
      for (int64_t j = 0; j < E; ++j) {
        bool taken = false;
        for (int p = 0; p < i; ++p) taken |= chosen[p] == j;
        if (!taken && (best < 0 || row[j] > row[best])) best = j;
      }
      chosen[i] = static_cast<int32_t>(best);
      w[i] = expf(row[best] - row[chosen[0]]);
      sum += w[i];
    }
    for (int i = 0; i < k; ++i) {
      expert[n * k + i] = chosen[i];
      weight[n * k + i] = w[i] / sum;
    }
  }
}

// One block; thread e (looping over experts) counts expert e's slots, a serial scan makes the
// offsets, then each expert's slots are written in slot order: a stable counting sort.
__global__ void PermuteKernel(const int32_t* __restrict__ expert, int64_t S, int64_t E,
                              int32_t* __restrict__ order, int64_t* __restrict__ offsets) {
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t c = 0;
    for (int64_t s = 0; s < S; ++s) c += expert[s] == e;
    offsets[e + 1] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t p = offsets[e];
    for (int64_t s = 0; s < S; ++s)
      if (expert[s] == e) order[p++] = static_cast<int32_t>(s);
  }
}

}  // namespace

int MoeMaxK() { return kMaxK; }

cudaError_t MoeRoute(const float* logits, int64_t N, int64_t E, int k, int32_t* expert,
                     float* weight, int64_t grid, cudaStream_t s) {
  if (k < 1 || k > kMaxK) return cudaErrorInvalidValue;
  if (grid > 0) EMBER_LAUNCH(RouteKernel, grid, 256, 0, s)(logits, N, E, k, expert, weight);
  return cudaGetLastError();
}

cudaError_t MoePermute(const int32_t* expert, int64_t S, int64_t E, int32_t* order,
                       int64_t* offsets, cudaStream_t s) {
  EMBER_LAUNCH(PermuteKernel, 1, 1024, 0, s)(expert, S, E, order, offsets);
  return cudaGetLastError();
}

}  // namespace ember::kernels::cuda::detail
