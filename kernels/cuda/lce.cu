// Fused linear cross-entropy row kernels: an online log-sum-exp over vocabulary tiles (the tiles
// come from cuBLASLt GEMMs in gemm.cc / ops.cc), the per-chunk loss and the in-place gradient of a
// tile. The full N x V logits never exist. Row state: 5 floats per chunk row, laid out
// [max | sum | target logit | logit sum | lse] each `rows` long. Contracts: launch.h.
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace ember::kernels::cuda::detail {
namespace {

constexpr int kBlock = 256;

__global__ void InitRowsKernel(int64_t rows, float* state) {
  EMBER_GRID_STRIDE(r, rows) {
    state[r] = -INFINITY;
    state[rows + r] = 0;
    state[2 * rows + r] = 0;
    state[3 * rows + r] = 0;
    state[4 * rows + r] = 0;
  }
}

__global__ void UpdateRowsKernel(const float* __restrict__ z, int64_t rows, int64_t cols,
                                 int64_t v0, const int32_t* __restrict__ targets,
                                 int64_t ignore_index, float* __restrict__ state) {
  EMBER_SHARED(float, red, [32]);
  const int64_t r = blockIdx.x;
  const float* zr = z + r * cols;
  float m = -INFINITY, s = 0, sum = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float e = zr[j];
    sum += e;
    OnlineAdd(e, m, s);
  }
  float S;
  const float M = BlockOnlineMerge(m, s, &S, red);
  const float Z = BlockSum(sum, red);
  if (threadIdx.x == 0) {
    const float m_old = state[r], s_old = state[rows + r];
    const float m_new = fmaxf(m_old, M);
    state[r] = m_new;
    state[rows + r] = (m_old == -INFINITY ? 0.0f : s_old * expf(m_old - m_new)) +
                      S * expf(M - m_new);
    state[3 * rows + r] += Z;
    const int64_t y = targets[r];
    if (y != ignore_index && y >= v0 && y < v0 + cols) state[2 * rows + r] = zr[y - v0];
  }
}

__global__ void FinishRowsKernel(int64_t rows, const int32_t* __restrict__ targets, int64_t V,
                                 int64_t ignore_index, float eps, float zc,
                                 float* __restrict__ state, double* __restrict__ total,
                                 int* __restrict__ bad_target) {
  EMBER_SHARED(double, red, [32]);
  double loss = 0, count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const float lse = state[r] + logf(state[rows + r]);
    state[4 * rows + r] = lse;
    const int64_t y = targets[r];
    if (y == ignore_index) continue;
    if (y < 0 || y >= V) {
      *bad_target = 1;
      continue;
    }
    loss += static_cast<double>(lse) - (1.0 - eps) * state[2 * rows + r] -
            (static_cast<double>(eps) / V) * state[3 * rows + r] +
            static_cast<double>(zc) * lse * lse;
    count += 1;
  }
  loss = BlockSum(loss, red);
  count = BlockSum(count, red);
  if (threadIdx.x == 0) {
    total[0] += loss;
    total[1] += count;
  }
}

__global__ void CountValidKernel(const int32_t* __restrict__ targets, int64_t N,
                                 int64_t ignore_index, double* __restrict__ valid) {
  EMBER_SHARED(double, red, [32]);
  double c = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) c += targets[i] != ignore_index ? 1 : 0;
  c = BlockSum(c, red);
  if (threadIdx.x == 0) valid[0] = c;
}

__global__ void GradTileKernel(float* __restrict__ z, int64_t rows, int64_t cols, int64_t v0,
                               int64_t V, const int32_t* __restrict__ targets,
                               int64_t ignore_index, float eps, float zc,
                               const float* __restrict__ state, const double* __restrict__ valid,
                               bool mean, float dloss) {
  const int64_t r = blockIdx.x;
  float* zr = z + r * cols;
  const int64_t y = targets[r];
  if (y == ignore_index || y < 0 || y >= V) {
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) zr[j] = 0;
    return;
  }
  const float lse = state[4 * rows + r];
  const float coef =
      mean ? static_cast<float>(dloss / (valid[0] > 0 ? valid[0] : 1.0)) : dloss;
  const float k = 1.0f + 2.0f * zc * lse;
  const float smooth = eps / V;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float g = expf(zr[j] - lse) * k - smooth;
    if (v0 + j == y) g -= 1.0f - eps;
    zr[j] = coef * g;
  }
}

}  // namespace

cudaError_t LceInitRows(int64_t rows, float* state, cudaStream_t s) {
  if (rows > 0)
    EMBER_LAUNCH(InitRowsKernel, (rows + kBlock - 1) / kBlock, kBlock, 0, s)(rows, state);
  return cudaGetLastError();
}
cudaError_t LceUpdateRows(const float* z, int64_t rows, int64_t cols, int64_t v0,
                          const int32_t* targets, int64_t ignore_index, float* state,
                          cudaStream_t s) {
  if (rows > 0 && cols > 0)
    EMBER_LAUNCH(UpdateRowsKernel, rows, kBlock, 0, s)(z, rows, cols, v0, targets, ignore_index,
                                                       state);
  return cudaGetLastError();
}
cudaError_t LceFinishRows(int64_t rows, const int32_t* targets, int64_t V, int64_t ignore_index,
                          float label_smoothing, float z_loss, float* state, double* total,
                          int* bad_target, cudaStream_t s) {
  if (rows > 0)
    EMBER_LAUNCH(FinishRowsKernel, 1, 1024, 0, s)(rows, targets, V, ignore_index,
                                                  label_smoothing, z_loss, state, total,
                                                  bad_target);
  return cudaGetLastError();
}
cudaError_t LceCountValid(const int32_t* targets, int64_t N, int64_t ignore_index, double* valid,
                          cudaStream_t s) {
  EMBER_LAUNCH(CountValidKernel, 1, 1024, 0, s)(targets, N, ignore_index, valid);
  return cudaGetLastError();
}
cudaError_t LceGradTile(float* z, int64_t rows, int64_t cols, int64_t v0, int64_t V,
                        const int32_t* targets, int64_t ignore_index, float label_smoothing,
                        float z_loss, const float* state, const double* valid, bool mean,
                        float dloss, cudaStream_t s) {
  if (rows > 0 && cols > 0)
    EMBER_LAUNCH(GradTileKernel, rows, kBlock, 0, s)(z, rows, cols, v0, V, targets, ignore_index,
                                                     label_smoothing, z_loss, state, valid, mean,
                                                     dloss);
  return cudaGetLastError();
}

}  // namespace ember::kernels::cuda::detail
