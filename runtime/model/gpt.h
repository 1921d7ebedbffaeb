// GPT-style and Llama-style decoders with hand-written forward and backward passes on the CPU
// kernels.
//
//   gpt:   tokens[B,T] -> wte[tok] + wpe[t] -> n_layer x Block -> RMSNorm (ln_f) -> fused linear
//          cross-entropy against targets with the LM head tied to wte.
//   llama: tokens[B,T] -> wte[tok] -> n_layer x Block (RoPE on q and k, grouped-query attention)
//          -> RMSNorm (ln_f) -> fused linear cross-entropy with lm_head (or wte when tied).
//   Block: x + Attn(RMSNorm(x)) -> h; h + Mlp(RMSNorm(h)), Mlp = GELU MLP | SwiGLU MLP | top-k MoE.
// docs/model.md has the exact math, shapes, initialisation and parameter names.
//
// Two levels of API:
//  * Gpt owns flat parameter/gradient buffers and runs a whole step (ForwardBackward) through the
//    model driver (driver.h) with no hooks, which is what single-process training uses.
//  * Block runs one transformer block on parameter and gradient pointers the caller provides, so a
//    sharded (FSDP) runtime can gather a block's parameters just in time, run Block::Forward /
//    Block::Backward, and reduce-scatter its gradients. ParamSpecs() lists every parameter in a
//    fixed order with its name and shape, and InitParam() initialises any slice of any parameter
//    from (seed, name) alone, so shards initialise independently and agree with the unsharded model.
//
// Thread safety: Gpt and Block are thread-compatible: one step at a time per instance; kernels
// inside use the ExecContext's pool.
//
//   GptConfig cfg;  // defaults: the job spec's (docs/job-spec.md): vocab 256, context 128, 2
//                   // layers, 4 heads, width 128, GELU
//   ASSIGN_OR_RETURN(auto model, Gpt::Create(cfg, /*seed=*/1));
//   model->ZeroGrad();
//   ASSIGN_OR_RETURN(float loss, model->ForwardBackward(ctx, tokens, targets, B, T));
//   adamw.Step(ctx, *model);
#ifndef EMBER_RUNTIME_MODEL_GPT_H_
#define EMBER_RUNTIME_MODEL_GPT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cross_entropy.h"
#include "kernels/exec_context.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "kernels/tensor.h"

namespace ember::model {

// Defaults are the job spec's defaults (runtime/jobspec ApplyDefaults; runtime/worker:trainer_test
// checks that they agree), listed once in docs/model.md.
struct GptConfig {
  enum class Mlp { kGelu, kSwiGlu, kMoe };
  enum class Arch { kGpt, kLlama };
  Arch arch = Arch::kGpt;
  int64_t vocab_size = 256;
  int64_t context = 128;  // maximum T (rows of wpe)
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t d_model = 128;
  Mlp mlp = Mlp::kGelu;
  int64_t d_ff = 0;       // hidden width; 0: 4*d_model (GELU, MoE experts) or 8/3*d_model rounded
                          // up to a multiple of 16 (SwiGLU)
  int64_t n_expert = 4;   // MoE only
  int64_t top_k = 2;      // MoE only
  int64_t window = 0;     // attention window in keys; 0: full causal
  float norm_eps = 1e-5f;
  float init_std = 0.02f;
  kernels::LceOptions loss;  // ignore_index, label smoothing, z-loss, reduction
  // llama only (the gpt arch refuses other values): key/value heads (0: n_head; must divide
  // n_head), RoPE base and Llama 3 frequency scaling, and whether the LM head is wte (true) or
  // its own lm_head.weight (false; the llama job-spec default). gpt always ties.
  int64_t n_kv_head = 0;
  float rope_theta = 10000.0f;
  kernels::RopeScaling rope_scaling;
  bool tie_embeddings = true;

  int64_t head_dim() const { return d_model / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // Rows of attn.qkv.weight: (n_head + 2 kv_heads) * head_dim (3C without GQA).
  int64_t qkv_width() const { return (n_head + 2 * kv_heads()) * head_dim(); }
  int64_t ff() const;
  // InvalidArgument naming the first bad field.
  absl::Status Validate() const;
};

// The 5.3M-parameter model of the benchmarks (kernel_bench, fsdp_bench; docs/benchmarks.md):
// vocab 8192, context 256, 4 layers, 4 heads, width 256, GELU MLP, other fields default.
GptConfig BenchmarkConfig();
// GptConfig{} with arch llama, SwiGLU MLP and an untied head (what `model.arch: llama` defaults to).
GptConfig LlamaConfig();

// One parameter: hierarchical name (e.g. "blocks.3.attn.qkv.weight"), shape, and init rule:
// normal(0, init_std) elementwise, or all ones when init_std == 0 (norm weights).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  float init_std = 0;
  int64_t numel() const;
};

// Every parameter in a fixed order: wte.weight, wpe.weight (gpt only), blocks.0.*, ...,
// ln_f.weight, lm_head.weight (untied only).
std::vector<ParamSpec> ParamSpecs(const GptConfig& cfg);
// The parameters outside the blocks, in ParamSpecs order: wte, [wpe], ln_f, [lm_head].
std::vector<std::string> RootParamNames(const GptConfig& cfg);
// The parameters of block `layer`, in the order Block expects its pointers.
std::vector<ParamSpec> BlockParamSpecs(const GptConfig& cfg, int64_t layer);

// Writes elements [offset, offset + count) of the flattened parameter `spec` initialised from
// `seed`. Each element depends only on (seed, spec.name, element index), so any slicing agrees.
void InitParam(const ParamSpec& spec, uint64_t seed, int64_t offset, int64_t count, float* out);

// Saved activations of one block between Forward and Backward; Backward releases them as soon as
// they are no longer needed. Opaque; movable.
struct BlockActivations;
struct BlockActivationsDeleter { void operator()(BlockActivations* a) const; };
using BlockActivationsPtr = std::unique_ptr<BlockActivations, BlockActivationsDeleter>;

// The weight gradients Block::BackwardInput deferred: the inputs and output gradients of the
// block's linear layers, until Block::BackwardWeight. Opaque; movable.
struct BlockWeightGrads;
struct BlockWeightGradsDeleter { void operator()(BlockWeightGrads* w) const; };
using BlockWeightGradsPtr = std::unique_ptr<BlockWeightGrads, BlockWeightGradsDeleter>;

class Block {
 public:
  Block(const GptConfig& cfg, int64_t layer);

  // Forward over x[B,T,C] (read; copied into the activations) into y[B,T,C] (written; y may alias
  // x). `w` holds BlockParamSpecs(cfg, layer).size() pointers in that order; they need only stay
  // valid for this call (Backward takes them again), so parameters can be gathered per call.
  absl::StatusOr<BlockActivationsPtr> Forward(const kernels::ExecContext& ctx,
                                              absl::Span<const float* const> w, const float* x,
                                              float* y, int64_t B, int64_t T) const;

  // Backward from dy[B,T,C] into dx[B,T,C] (written; may alias dy). Gradients are accumulated
  // into `g` (same order as w). Consumes and frees `acts`.
  absl::Status Backward(const kernels::ExecContext& ctx, absl::Span<const float* const> w,
                        absl::Span<float* const> g, BlockActivationsPtr acts, const float* dy,
                        float* dx) const;

  // Backward split in two (zero-bubble schedules). BackwardInput is Backward without the linear
  // layers' weight gradients: it writes dx, accumulates the norm weights' gradients into `g`
  // (O(N*C) work) and returns what BackwardWeight needs to accumulate the linear weights'
  // gradients into `g` later (their inputs and output gradients; the rest of `acts` is freed).
  // BackwardInput then BackwardWeight leave dx and `g` bitwise equal to Backward.
  absl::StatusOr<BlockWeightGradsPtr> BackwardInput(const kernels::ExecContext& ctx,
                                                    absl::Span<const float* const> w,
                                                    absl::Span<float* const> g,
                                                    BlockActivationsPtr acts, const float* dy,
                                                    float* dx) const;
  absl::Status BackwardWeight(const kernels::ExecContext& ctx, absl::Span<float* const> g,
                              BlockWeightGradsPtr saved) const;

 private:
  // Backward; with `defer` set, the linear weight gradients are saved there instead.
  absl::Status BackwardImpl(const kernels::ExecContext& ctx, absl::Span<const float* const> w,
                            absl::Span<float* const> g, BlockActivationsPtr acts,
                            const float* dy, float* dx, BlockWeightGrads* defer) const;

  const GptConfig cfg_;
  const int64_t layer_;
  std::shared_ptr<const kernels::RopeTable> rope_;  // llama: positions [0, context)
};

// The ends of the model on caller-held parameters, for pipeline stages (runtime/pipeline): the
// first stage embeds, the last one normalises and takes the loss. Gpt::Run is built from them.
//
// x[B*T,C] = wte[tokens] + wpe[t] (llama: wte[tokens]; wpe and g_wpe are then unused and may be
// null). InvalidArgument for T > context or a token outside the vocab.
absl::Status EmbedForward(const kernels::ExecContext& ctx, const GptConfig& cfg, const float* wte,
                          const float* wpe, const int32_t* tokens, int64_t B, int64_t T, float* x);
// Accumulates the embedding gradients of dx[B*T,C] into g_wte and g_wpe.
void EmbedBackward(const kernels::ExecContext& ctx, const GptConfig& cfg, const int32_t* tokens,
                   int64_t B, int64_t T, const float* dx, float* g_wte, float* g_wpe);
// RMSNorm (ln_f) then the fused LM-head loss of x[B*T,C] against targets; `wte` is the head
// weight [V,C]: wte when tied, lm_head.weight when not (g_wte likewise).
// With dx != nullptr also the backward, scaled by dloss: *dx becomes a new [B*T,C] tensor, the
// gradient w.r.t. x (allocated once the logits' workspace is gone), and g_lnf and g_wte are
// accumulated. Returns the reduced loss (unscaled).
absl::StatusOr<float> HeadLoss(const kernels::ExecContext& ctx, const GptConfig& cfg,
                               const float* w_lnf, const float* wte, const float* x,
                               const int32_t* targets, int64_t B, int64_t T, float dloss,
                               kernels::Tensor* dx, float* g_lnf, float* g_wte);

class Driver;  // driver.h

class Gpt {
 public:
  ~Gpt();
  // Validates cfg, allocates parameters (initialised from seed) and zeroed gradients.
  static absl::StatusOr<std::unique_ptr<Gpt>> Create(const GptConfig& cfg, uint64_t seed);

  const GptConfig& config() const { return cfg_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t num_params() const { return params_.numel(); }
  float* param(size_t i) { return params_.data<float>() + offsets_[i]; }
  float* grad(size_t i) { return grads_.data<float>() + offsets_[i]; }
  float* params_flat() { return params_.data<float>(); }
  float* grads_flat() { return grads_.data<float>(); }
  // Index into specs() by name; -1 when absent.
  int FindParam(const std::string& name) const;

  void ZeroGrad();

  // Forward, loss and backward for tokens/targets [B,T] (int32; targets may hold the loss's
  // ignore_index). Gradients are accumulated into grads. Returns the (reduced) loss.
  // InvalidArgument for T > context or tokens/targets out of range.
  absl::StatusOr<float> ForwardBackward(const kernels::ExecContext& ctx, const int32_t* tokens,
                                        const int32_t* targets, int64_t B, int64_t T);
  // Loss only (no activations kept).
  absl::StatusOr<float> Loss(const kernels::ExecContext& ctx, const int32_t* tokens,
                             const int32_t* targets, int64_t B, int64_t T);

  // High-water mark of bytes allocated above the parameters/gradients during the last step:
  // activations plus kernel workspaces.
  int64_t peak_activation_bytes() const { return peak_activation_bytes_; }

 private:
  explicit Gpt(const GptConfig& cfg);
  absl::StatusOr<float> Run(const kernels::ExecContext& ctx, const int32_t* tokens,
                            const int32_t* targets, int64_t B, int64_t T, bool backward);

  GptConfig cfg_;
  std::vector<ParamSpec> specs_;
  std::vector<int64_t> offsets_;
  kernels::Tensor params_, grads_;
  std::unique_ptr<const Driver> driver_;  // the whole model (driver.h)
  int64_t peak_activation_bytes_ = 0;
};

// AdamW over all of a Gpt's parameters, with optional global-norm clipping.
class AdamW {
 public:
  AdamW(const kernels::AdamWOptions& opt, int64_t num_params, double clip_norm = 0);
  // Clips (when clip_norm > 0) and applies one step; returns the pre-clip gradient norm (0 when
  // not clipping).
  double Step(const kernels::ExecContext& ctx, Gpt& model);
  kernels::AdamWOptions& options() { return opt_; }

 private:
  kernels::AdamWOptions opt_;
  double clip_norm_;
  int64_t step_ = 0;
  kernels::Tensor m_, v_;
};

}  // namespace ember::model

#endif  // EMBER_RUNTIME_MODEL_GPT_H_
