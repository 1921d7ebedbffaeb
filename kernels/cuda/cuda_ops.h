// CUDA versions of the kernels/ ops, each with the contract of its CPU reference (kernels/ops.h,
// cast.h, gemm.h, cross_entropy.h) on device pointers, queued on the context's stream.
//
// NOTHING HERE HAS RUN ON A GPU YET: the code is compiled for sm_75/sm_80/sm_90 (+PTX) and its
// host-side plans are tested on CPU; the GPU tests (tests/gpu/cuda_kernels.sh) are ready to run.
//
// Availability: CudaContext::Create returns Unavailable in a CPU-only build (no toolkit at
// configure time) and on a machine without a usable GPU or driver. The op functions exist only
// when EMBER_WITH_CUDA is defined (@local_cuda//:cudart defines it); guard calls with it.
//
// Determinism: every op gives bitwise identical results run to run on one GPU model (no atomics;
// reductions have a fixed order, fixed splits from plan.h). Results differ from the CPU reference
// within fp32 rounding (bf16 inputs: bf16 rounding).
//
// Errors: each call returns the launch error of what it queued (Internal, naming the op); faults
// inside a kernel surface at the next Synchronize(). Calls that return a value (norm, loss) sync.
//
// Thread safety: a CudaContext is used by one thread at a time (it owns a stream, a cuBLASLt
// handle and its workspace); its allocator is thread-safe.
#ifndef EMBER_KERNELS_CUDA_CUDA_OPS_H_
#define EMBER_KERNELS_CUDA_CUDA_OPS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/moe.h"
#include "kernels/cuda/allocator.h"
#include "kernels/ops.h"

namespace ember::kernels::cuda {

class CudaContext {
 public:
  // Selects `device`, creates a non-blocking stream, a cuBLASLt handle and a caching allocator
  // (with a 32 MiB GEMM workspace from it). Unavailable without CUDA or GPU (the reason says which).
  static absl::StatusOr<std::unique_ptr<CudaContext>> Create(int device = 0);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  void* stream() const { return stream_; }  // cudaStream_t
  CachingAllocator& allocator() { return *allocator_; }
  absl::Status Synchronize();  // waits for the stream; reports kernel faults
  std::string DeviceName() const;

 private:
  friend struct ContextAccess;
  CudaContext() = default;
  int device_ = 0;
  void* stream_ = nullptr;
  void* cublaslt_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::unique_ptr<CachingAllocator> allocator_;
};

// A CachingAllocator over cudaMalloc/cudaFree on the current device.
std::unique_ptr<CachingAllocator> NewCudaAllocator();

#ifdef EMBER_WITH_CUDA

// Casts (raw bf16 bits), kernels/cast.h.
absl::Status CastF32ToBf16(CudaContext& ctx, const float* in, uint16_t* out, int64_t n);
absl::Status CastBf16ToF32(CudaContext& ctx, const uint16_t* in, float* out, int64_t n);

// kernels/ops.h contracts.
absl::Status EmbeddingForward(CudaContext& ctx, const int32_t* ids, int64_t N, const float* table,
                              int64_t C, float* out, bool accumulate);
absl::Status EmbeddingBackward(CudaContext& ctx, const int32_t* ids, int64_t N, const float* dout,
                               int64_t C, float* dtable);
absl::Status RmsNormForward(CudaContext& ctx, const float* x, const float* w, int64_t N, int64_t C,
                            float eps, float* y, float* rstd);
absl::Status RmsNormBackward(CudaContext& ctx, const float* x, const float* w, const float* rstd,
                             const float* dy, int64_t N, int64_t C, float* dx, float* dw);
absl::Status GeluForward(CudaContext& ctx, const float* x, float* y, int64_t n);
absl::Status GeluBackward(CudaContext& ctx, const float* x, const float* dy, float* dx, int64_t n);
absl::Status SwiGluForward(CudaContext& ctx, const float* x, int64_t N, int64_t F, float* y);
absl::Status SwiGluBackward(CudaContext& ctx, const float* x, const float* dy, int64_t N,
                            int64_t F, float* dx);
// out = a + b (out may alias a or b); y += x. Bitwise the CPU's (one fp32 add per element).
absl::Status Add(CudaContext& ctx, const float* a, const float* b, float* out, int64_t n);
absl::Status AddInPlace(CudaContext& ctx, const float* x, float* y, int64_t n);
absl::Status SoftmaxForward(CudaContext& ctx, const float* x, int64_t N, int64_t C, float* y);
absl::Status SoftmaxBackward(CudaContext& ctx, const float* y, const float* dy, int64_t N,
                             int64_t C, float* dx);

// One multi-tensor AdamW step over every tensor (kernels/ops.h AdamWStep per tensor).
struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
};
absl::Status AdamWStep(CudaContext& ctx, const AdamWOptions& opt, int64_t step,
                       const std::vector<AdamWTensor>& ts);
// Global L2 norm (sum of squares in double over the CPU's 16K-element chunks, added in order) and
// clipping (ClipGradNorm semantics; the scale is decided on the device). Both sync to return it.
absl::StatusOr<double> GlobalL2Norm(CudaContext& ctx,
                                    const std::vector<std::pair<const float*, int64_t>>& ts);
absl::StatusOr<double> ClipGradNorm(CudaContext& ctx,
                                    const std::vector<std::pair<float*, int64_t>>& ts,
                                    double max_norm);

// cuBLASLt GEMM with kernels/gemm.h's row-major contract: C[M,N] = act(alpha op(A) op(B) +
// beta C + bias[N]); fp32 accumulation and output. Inputs f32 (exact fp32, no TF32) or bf16 (raw
// bits). bias is fp32 [N] (required for kBias / kGeluBias). GELU is the tanh form (as GeluForward).
enum class GemmInput { kF32, kBF16 };
enum class GemmEpilogue { kNone, kBias, kGelu, kGeluBias };
absl::Status Gemm(CudaContext& ctx, GemmInput in, bool trans_a, bool trans_b, int64_t M, int64_t N,
                  int64_t K, float alpha, const void* A, int64_t lda, const void* B, int64_t ldb,
                  float beta, float* C, int64_t ldc, GemmEpilogue epilogue = GemmEpilogue::kNone,
                  const float* bias = nullptr);

// cuBLASLt's heuristic assumes 256-byte-aligned pointers unless told otherwise, and may then pick
// a kernel that faults or misreads on an offset pointer (MoE expert slices, fused cross-entropy
// chunks). Gemm sets CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES from the actual pointers:
// the largest power of two dividing the address, at most 256 (256 for null).
uint32_t PointerAlignment(const void* p);
// The alignments Gemm passed for its operands (ours: a = A, b = B, c = d = C).
struct GemmAlignment {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};
// Test hook: called by every Gemm with the alignments it gave the heuristic (null: none).
using GemmAlignmentObserver = void (*)(const GemmAlignment&);
void SetGemmAlignmentObserver(GemmAlignmentObserver f);

// Fused linear cross-entropy (kernels/cross_entropy.h contract, fp32 h and W): logits exist only
// as one token_chunk x vocab_chunk tile (plan.h PlanLce with opt.token_chunk, opt.vocab_chunk and
// budget_bytes); tiles are recomputed for the backward. Syncs once at the end to return the loss.
absl::StatusOr<LceResult> FusedLinearCrossEntropy(CudaContext& ctx, const LceOptions& opt,
                                                  const float* h, const float* W,
                                                  const int32_t* targets, int64_t N, int64_t d,
                                                  int64_t V, float* dh, float* dW,
                                                  float dloss = 1.0f, int64_t budget_bytes = 0);

// Causal attention with optional sliding window (kernels/attention.h contract, fp32, flash-style:
// fully masked key tiles are skipped), grouped-query attention included (s.KV key/value heads
// dividing H, the CPU's layout). Head sizes 32 and 64 only, B * H <= 65535 (InvalidArgument
// otherwise). Backward is always deterministic (dq per query tile; dk/dv per key tile of a kv head,
// its group's query heads added in head order inside one block: no atomics). CUDA cores only (no
// tensor cores): correct first, not fast.
absl::Status AttentionForward(CudaContext& ctx, const AttentionShape& s, const float* q,
                              const float* k, const float* v, int64_t qkv_stride, float* o,
                              int64_t o_stride, float* lse);
absl::Status AttentionBackward(CudaContext& ctx, const AttentionShape& s, const float* q,
                               const float* k, const float* v, int64_t qkv_stride, const float* o,
                               const float* dout, int64_t o_stride, const float* lse, float* dq,
                               float* dk, float* dv);

// RoPE in place (kernels/rope.h contract and layout). The table is a device copy of a host
// kernels::RopeTable (MakeRopeTable(RopeInvFreq(hd, theta, scaling), T_max): the frequencies,
// Llama 3.1 rule included, are computed once on the host): cos and sin [T, half] floats each,
// row-major, as in the RopeTable's vectors; the caller owns that memory. Bitwise equal to the CPU
// (the same float32 products and sums, never fused into FMAs). InvalidArgument unless hd is even,
// table.half == hd / 2, table.T >= T and stride >= heads * hd.
struct RopeDeviceTable {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t T = 0, half = 0;
};
absl::Status RopeForward(CudaContext& ctx, const RopeDeviceTable& table, float* x, int64_t B,
                         int64_t T, int64_t heads, int64_t hd, int64_t stride);
absl::Status RopeBackward(CudaContext& ctx, const RopeDeviceTable& table, float* dx, int64_t B,
                          int64_t T, int64_t heads, int64_t hd, int64_t stride);

// MoE (kernels/moe.h contracts, device pointers). k <= 8 (InvalidArgument otherwise).
absl::Status MoeRoute(CudaContext& ctx, const float* logits, int64_t N, int64_t E, int k,
                      int32_t* expert, float* weight);
absl::Status MoePermute(CudaContext& ctx, const int32_t* expert, int64_t S, int64_t E,
                        int32_t* order, int64_t* offsets);
// Grouped expert GEMM: one cuBLASLt call per non-empty expert. X [S, in] and W [E, out, in] are
// f32 or bf16 (`in`); Y fp32. offsets is on the device; it is read back (one sync) to size the
// calls.
absl::Status GroupedLinearForward(CudaContext& ctx, GemmInput in_type, const void* X,
                                  const void* W, const int64_t* offsets, int64_t E, int64_t in,
                                  int64_t out, float* Y);

#endif  // EMBER_WITH_CUDA

}  // namespace ember::kernels::cuda

#endif  // EMBER_KERNELS_CUDA_CUDA_OPS_H_
