// One GPU training step of the Gpt model (gpt.h) on the CUDA ops (kernels/cuda/cuda_ops.h), fp32:
// the same forward, loss and backward math as Gpt::ForwardBackward and the same AdamW (+ optional
// global-norm clipping) as model::AdamW, so the two can be compared step by step
// (tests/gpu/gpt_cuda_check.cc).
//
// NOT RUN ON A GPU YET: written and built on a CPU-only machine. Its whole step has run on the
// CUDA interpreter (:gpt_cuda_interp, tests/gpu:gpt_cuda_interp_test, docs/gpu-testing.md): the
// same code and kernels as host C++, against the CPU model; not a GPU's numerics or timing.
//
// Supported: arch gpt and llama (RoPE, grouped-query attention, tied or untied head), GELU or
// SwiGLU MLP, full causal or sliding-window attention, head sizes 32 and 64 (the CUDA attention's).
// MoE and other head sizes: Unimplemented (use the CPU model).
//
// Ownership: GptCuda borrows the CudaContext (it must outlive the GptCuda) and owns device arenas
// from the context's allocator: parameters, gradients, AdamW moments (each in
// PlanGptCudaParams' padded layout) and one step's activations (PlanGptCudaActivations, kept
// between steps and re-planned when B x T changes). Host buffers passed in are only read or
// written during the call. Every call synchronises the context's stream before it returns, so
// results are final and device faults surface as the call's Status.
//
// Thread safety: thread-compatible; one call at a time, and not concurrently with other users of
// the same CudaContext (it has one stream).
//
// Without CUDA (EMBER_WITH_CUDA undefined) Create returns Unavailable.
//
//   ASSIGN_OR_RETURN(auto ctx, kernels::cuda::CudaContext::Create(0));
//   ASSIGN_OR_RETURN(auto gpu, GptCuda::Create(cfg, *ctx));
//   RETURN_IF_ERROR(gpu->UploadParams(*cpu_model));
//   RETURN_IF_ERROR(gpu->ZeroGrad());
//   ASSIGN_OR_RETURN(float loss, gpu->ForwardBackward(tokens, targets, B, T));
//   ASSIGN_OR_RETURN(double norm, gpu->AdamWStep(adamw_options, /*clip_norm=*/1.0));
#ifndef EMBER_RUNTIME_MODEL_GPT_CUDA_H_
#define EMBER_RUNTIME_MODEL_GPT_CUDA_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "runtime/model/gpt.h"
#include "runtime/model/gpt_cuda_plan.h"

namespace ember::model {

class GptCuda {
 public:
  // Validates cfg (InvalidArgument), refuses what is not supported (Unimplemented), allocates the
  // parameter-shaped arenas (parameters uninitialised until UploadParams; gradients and moments
  // zero). Unavailable without CUDA.
  static absl::StatusOr<std::unique_ptr<GptCuda>> Create(const GptConfig& cfg,
                                                         kernels::cuda::CudaContext& ctx);
  ~GptCuda();
  GptCuda(const GptCuda&) = delete;
  GptCuda& operator=(const GptCuda&) = delete;

  const GptConfig& config() const { return cfg_; }
  int64_t num_params() const { return layout_.host_total; }

  // Parameters from/to a host buffer in Gpt's flat layout (num_params() floats; InvalidArgument
  // for another size). UploadParams(model) copies model.params_flat(); the configs must agree.
  absl::Status UploadParams(const float* host, int64_t n);
  absl::Status UploadParams(Gpt& model);
  absl::Status DownloadParams(float* host, int64_t n);
  absl::Status DownloadGrads(float* host, int64_t n);
  // The AdamW state, for checkpoints: exp_avg and exp_avg_sq in Gpt's flat layout (num_params()
  // floats each; InvalidArgument for another size) and optimizer_step(), the AdamWStep calls so
  // far. After UploadOptimizerState(m, v, n, k) the next AdamWStep is step k + 1 with those
  // moments, exactly as if the k steps had run here.
  absl::Status DownloadOptimizerState(float* exp_avg, float* exp_avg_sq, int64_t n);
  absl::Status UploadOptimizerState(const float* exp_avg, const float* exp_avg_sq, int64_t n,
                                    int64_t step);
  int64_t optimizer_step() const { return step_; }

  absl::Status ZeroGrad();
  // Gpt::ForwardBackward on the GPU: tokens and targets are host int32 [B,T] (checked on the host:
  // InvalidArgument for T > context or a value outside the vocab that is not the loss's
  // ignore_index). Gradients of grad_scale x loss are accumulated (data parallel over W ranks
  // passes 1/W, so that the all-reduced sum is the mean: exactly the CPU's sum-then-scale when W
  // is a power of two). Returns the reduced loss (unscaled).
  absl::StatusOr<float> ForwardBackward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                        int64_t T, float grad_scale = 1.0f);
  // The gradient arena on the device, for a collective over it (data parallel's all-reduce):
  // grad_arena_floats() floats in PlanGptCudaParams' padded layout; the padding is zero after
  // ZeroGrad and no kernel writes it, so a sum over whole arenas keeps it zero. Valid while this
  // GptCuda lives; the context's stream is synchronised after every call, so between calls the
  // arena is final and may be read or written on another stream (the caller orders that stream's
  // work before the next call, e.g. Work::Wait with block_host).
  float* grad_arena() { return grads_; }
  int64_t grad_arena_floats() const { return layout_.total; }
  // model::AdamW::Step: clips when clip_norm > 0 (returns the pre-clip norm, else 0), then one
  // multi-tensor AdamW step; the step counter starts at 1 and is kept here.
  absl::StatusOr<double> AdamWStep(const kernels::AdamWOptions& opt, double clip_norm);

 private:
  GptCuda(const GptConfig& cfg, kernels::cuda::CudaContext& ctx);
  absl::Status EnsureActivations(int64_t B, int64_t T);
  absl::Status Copy(float* host, int64_t n, const float* arena);
  absl::Status Upload(const float* host, int64_t n, float* arena, const char* what);
  absl::Status BlockForward(int64_t l, int64_t B, int64_t T);
  absl::Status BlockBackward(int64_t l, int64_t B, int64_t T);

  const GptConfig cfg_;
  kernels::cuda::CudaContext& ctx_;
  const GptCudaParamLayout layout_;
  std::vector<std::vector<int>> block_index_;  // per block: spec indices in BlockParamSpecs order
  int wte_ = -1, wpe_ = -1, lnf_ = -1, head_ = -1;
  float* params_ = nullptr;  // device arenas (layout_.total floats each)
  float* grads_ = nullptr;
  float* m_ = nullptr;
  float* v_ = nullptr;
  float* rope_ = nullptr;    // llama: cos then sin, [context, head_dim / 2] each
  float* acts_ = nullptr;    // act_.total words
  GptCudaActLayout act_;
  int64_t step_ = 0;
};

}  // namespace ember::model

#endif  // EMBER_RUNTIME_MODEL_GPT_CUDA_H_
