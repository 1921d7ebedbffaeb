// Kernel launchers compiled by nvcc (the .cu files) and called by the host wrappers (ops.cc).
// Internal to //kernels/cuda: callers use cuda_ops.h. Every launcher queues work on `stream` and
// returns the launch error (cudaGetLastError); pointers are device pointers; shapes and contracts
// are cuda_ops.h's. Launch shapes come from plan.h and are passed in, so they are tested on CPU.
#ifndef EMBER_KERNELS_CUDA_LAUNCH_H_
#define EMBER_KERNELS_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ember::kernels::cuda::detail {

// Elementwise (elementwise.cu). bf16 values are raw uint16 bits.
cudaError_t CastF32ToBf16(const float* in, uint16_t* out, int64_t n, int64_t grid,
                          cudaStream_t s);
cudaError_t CastBf16ToF32(const uint16_t* in, float* out, int64_t n, int64_t grid,
                          cudaStream_t s);
cudaError_t GeluForward(const float* x, float* y, int64_t n, int64_t grid, cudaStream_t s);
cudaError_t GeluBackward(const float* x, const float* dy, float* dx, int64_t n, int64_t grid,
                         cudaStream_t s);
cudaError_t SwiGluForward(const float* x, int64_t N, int64_t F, float* y, int64_t grid,
                          cudaStream_t s);
cudaError_t SwiGluBackward(const float* x, const float* dy, int64_t N, int64_t F, float* dx,
                           int64_t grid, cudaStream_t s);
// out = a + b; out may alias a or b.
cudaError_t Add(const float* a, const float* b, float* out, int64_t n, int64_t grid,
                cudaStream_t s);
cudaError_t EmbeddingForward(const int32_t* ids, int64_t N, const float* table, int64_t C,
                             float* out, bool accumulate, int64_t grid, cudaStream_t s);
// Deterministic: thread c owns column c and adds rows in order (no atomics).
cudaError_t EmbeddingBackward(const int32_t* ids, int64_t N, const float* dout, int64_t C,
                              float* dtable, cudaStream_t s);

// Rows (rows.cu): one block of `block` threads per row.
cudaError_t RmsNormForward(const float* x, const float* w, int64_t N, int64_t C, float eps,
                           float* y, float* rstd, int block, cudaStream_t s);
// dx written per row; dw accumulated through `partial` (segments x C floats) in segment order.
cudaError_t RmsNormBackward(const float* x, const float* w, const float* rstd, const float* dy,
                            int64_t N, int64_t C, float* dx, float* dw, float* partial,
                            int64_t segments, int64_t rows_per_segment, int block,
                            cudaStream_t s);
cudaError_t SoftmaxForward(const float* x, int64_t N, int64_t C, float* y, int block,
                           cudaStream_t s);
cudaError_t SoftmaxBackward(const float* y, const float* dy, int64_t N, int64_t C, float* dx,
                            int block, cudaStream_t s);

// Multi-tensor (optim.cu). One batch of plan.h's MultiTensorBatch, flattened.
struct TensorBatchArgs {
  static constexpr int kMaxTensors = 24;
  static constexpr int kMaxChunks = 320;
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  int64_t n[kMaxTensors];
  int16_t chunk_tensor[kMaxChunks];
  int32_t chunk_index[kMaxChunks];
  int num_chunks;
  int64_t chunk;        // elements per chunk
  int64_t first_chunk;  // global index of chunk 0 of this batch (sum-of-squares partials)
};
struct AdamWArgs {
  float beta1, beta2, eps, decay, step_size, inv_sqrt_bc2;
};
cudaError_t AdamW(const TensorBatchArgs& b, const AdamWArgs& a, cudaStream_t s);
// partial[first_chunk + i] = sum of squares (double) of chunk i, for each chunk of the batch (p[]).
cudaError_t SumSquares(const TensorBatchArgs& b, double* partial, cudaStream_t s);
// out_norm[0] = sqrt(sum of partial[0..n) in order); when max_norm > 0 also
// scale[0] = norm > max_norm ? max_norm / (norm + 1e-6) : 1.
cudaError_t FinishNorm(const double* partial, int64_t n, double max_norm, double* out_norm,
                       float* scale, cudaStream_t s);
// p[i] *= scale[0] over the batch's chunks (skipped when scale is 1).
cudaError_t ScaleBy(const TensorBatchArgs& b, const float* scale, cudaStream_t s);

// Fused linear cross-entropy pieces (lce.cu); the tile GEMMs are cuBLASLt's (gemm.cc).
// state: 5 floats per chunk row (running max, running sum, target logit, logit sum, lse).
cudaError_t LceInitRows(int64_t rows, float* state, cudaStream_t s);
// Online log-sum-exp update over one tile z[rows, cols] (columns [v0, v0+cols) of the vocab).
cudaError_t LceUpdateRows(const float* z, int64_t rows, int64_t cols, int64_t v0,
                          const int32_t* targets, int64_t ignore_index, float* state,
                          cudaStream_t s);
// Finishes lse; adds this chunk's loss (rows in order) to total[0] and the valid count to
// total[1]; sets *bad_target to 1 on a target outside [0, V) that is not ignored.
cudaError_t LceFinishRows(int64_t rows, const int32_t* targets, int64_t V, int64_t ignore_index,
                          float label_smoothing, float z_loss, float* state, double* total,
                          int* bad_target, cudaStream_t s);
// valid[0] = number of targets != ignore_index over all N (one block, deterministic).
cudaError_t LceCountValid(const int32_t* targets, int64_t N, int64_t ignore_index, double* valid,
                          cudaStream_t s);
// z (tile) := dloss * scale * dz in place, scale = 1 / max(valid, 1) (mean) or 1 (sum).
cudaError_t LceGradTile(float* z, int64_t rows, int64_t cols, int64_t v0, int64_t V,
                        const int32_t* targets, int64_t ignore_index, float label_smoothing,
                        float z_loss, const float* state, const double* valid, bool mean,
                        float dloss, cudaStream_t s);

// Causal (sliding-window) attention (attention.cu), kernels/attention.h's layout; hd 32 or 64
// (cudaErrorInvalidValue otherwise). KV key/value heads, 1 <= KV, KV divides H (grouped-query
// attention; the caller checks); B * H <= 65535 (a grid dimension). delta: B*H*T floats of scratch.
struct AttentionDims {
  int64_t B, T, H, hd, window, qkv_stride, o_stride, KV;
};
bool AttentionSupportsHeadDim(int64_t hd);
cudaError_t AttentionForward(const AttentionDims& s, const float* q, const float* k,
                             const float* v, float* o, float* lse, cudaStream_t st);
cudaError_t AttentionBackward(const AttentionDims& s, const float* q, const float* k,
                              const float* v, const float* o, const float* dout, const float* lse,
                              float* delta, float* dq, float* dk, float* dv, cudaStream_t st);

// RoPE (rope.cu), kernels/rope.h's rotation in place with a device copy of a RopeTable's cos/sin
// ([>= T, hd / 2] each); sign +1: forward, -1: backward. hd even; 256-thread blocks.
cudaError_t Rope(const float* cos_t, const float* sin_t, float* x, int64_t B, int64_t T,
                 int64_t heads, int64_t hd, int64_t stride, float sign, int64_t grid,
                 cudaStream_t s);

// MoE (moe.cu), kernels/moe.h; k <= MoeMaxK() (cudaErrorInvalidValue otherwise).
int MoeMaxK();
cudaError_t MoeRoute(const float* logits, int64_t N, int64_t E, int k, int32_t* expert,
                     float* weight, int64_t grid, cudaStream_t s);
cudaError_t MoePermute(const int32_t* expert, int64_t S, int64_t E, int32_t* order,
                       int64_t* offsets, cudaStream_t s);

}  // namespace ember::kernels::cuda::detail

#endif  // EMBER_KERNELS_CUDA_LAUNCH_H_
