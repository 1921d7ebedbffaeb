// GptCuda: Gpt::Run / Block::Forward / Block::BackwardImpl (gpt.cc) step for step on the CUDA ops.
// NOT RUN ON A GPU YET (gpt_cuda.h).
#include "runtime/model/gpt_cuda.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

#ifdef EMBER_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/rope.h"
#endif

namespace ember::model {

namespace cu = kernels::cuda;

#ifndef EMBER_WITH_CUDA

namespace {
absl::Status NoCuda() {
  return absl::UnavailableError("GptCuda: built without CUDA (no toolkit at configure time)");
}
}  // namespace

GptCuda::GptCuda(const GptConfig& cfg, cu::CudaContext& ctx)
    : cfg_(cfg), ctx_(ctx), layout_(PlanGptCudaParams(cfg)) {}
GptCuda::~GptCuda() = default;
absl::StatusOr<std::unique_ptr<GptCuda>> GptCuda::Create(const GptConfig&, cu::CudaContext&) {
  return NoCuda();
}
absl::Status GptCuda::UploadParams(const float*, int64_t) { return NoCuda(); }
absl::Status GptCuda::UploadParams(Gpt&) { return NoCuda(); }
absl::Status GptCuda::DownloadParams(float*, int64_t) { return NoCuda(); }
absl::Status GptCuda::DownloadGrads(float*, int64_t) { return NoCuda(); }
absl::Status GptCuda::DownloadOptimizerState(float*, float*, int64_t) { return NoCuda(); }
absl::Status GptCuda::UploadOptimizerState(const float*, const float*, int64_t, int64_t) {
  return NoCuda();
}
absl::Status GptCuda::ZeroGrad() { return NoCuda(); }
absl::StatusOr<float> GptCuda::ForwardBackward(const int32_t*, const int32_t*, int64_t, int64_t,
                                               float) {
  return NoCuda();
}
absl::StatusOr<double> GptCuda::AdamWStep(const kernels::AdamWOptions&, double) { return NoCuda(); }

#else  // EMBER_WITH_CUDA

namespace {

cudaStream_t S(cu::CudaContext& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrCat("GptCuda: ", what, ": ", cudaGetErrorString(e)));
}

// Block parameter indices, BlockParamSpecs order (gpt.cc's BlockParam).
enum { kLn1 = 0, kQkv, kProj, kLn2, kFc1, kFc2 };

// y[N,out] = x[N,in] @ W[out,in]^T (kernels::LinearForward without bias).
absl::Status Linear(cu::CudaContext& c, const float* x, const float* W, int64_t N, int64_t in,
                    int64_t out, float* y) {
  return cu::Gemm(c, cu::GemmInput::kF32, false, true, N, out, in, 1.0f, x, in, W, in, 0.0f, y,
                  out);
}
// kernels::LinearBackward: dx[N,in] = dy @ W (written), dW[out,in] += dy^T @ x.
absl::Status LinearBack(cu::CudaContext& c, const float* x, const float* W, const float* dy,
                        int64_t N, int64_t in, int64_t out, float* dx, float* dW) {
  RETURN_IF_ERROR(cu::Gemm(c, cu::GemmInput::kF32, false, false, N, in, out, 1.0f, dy, out, W, in,
                           0.0f, dx, in));
  return cu::Gemm(c, cu::GemmInput::kF32, true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW,
                  in);
}

}  // namespace

GptCuda::GptCuda(const GptConfig& cfg, cu::CudaContext& ctx)
    : cfg_(cfg), ctx_(ctx), layout_(PlanGptCudaParams(cfg)) {}

GptCuda::~GptCuda() {
  ctx_.Synchronize().IgnoreError();
  for (float* p : {params_, grads_, m_, v_, rope_, acts_}) ctx_.allocator().Free(p).IgnoreError();
}

absl::StatusOr<std::unique_ptr<GptCuda>> GptCuda::Create(const GptConfig& cfg,
                                                         cu::CudaContext& ctx) {
  RETURN_IF_ERROR(cfg.Validate());
  if (cfg.mlp == GptConfig::Mlp::kMoe) {
    return absl::UnimplementedError(
        "GptCuda: the MoE MLP has no GPU step yet (no MoE backward on CUDA); use the CPU model");
  }
  if (cfg.head_dim() != 32 && cfg.head_dim() != 64) {
    return absl::UnimplementedError(absl::StrCat(
        "GptCuda: head_dim ", cfg.head_dim(), " (d_model ", cfg.d_model, " / n_head ", cfg.n_head,
        "); the CUDA attention supports 32 and 64 only"));
  }
  std::unique_ptr<GptCuda> m(new GptCuda(cfg, ctx));
  const std::vector<ParamSpec> specs = ParamSpecs(cfg);
  auto find = [&](const std::string& name) {
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].name == name) return static_cast<int>(i);
    return -1;
  };
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    std::vector<int> idx;
    for (const ParamSpec& s : BlockParamSpecs(cfg, l)) idx.push_back(find(s.name));
    m->block_index_.push_back(std::move(idx));
  }
  m->wte_ = find("wte.weight");
  m->wpe_ = find("wpe.weight");
  m->lnf_ = find("ln_f.weight");
  m->head_ = cfg.tie_embeddings ? m->wte_ : find("lm_head.weight");
  const size_t bytes = static_cast<size_t>(m->layout_.total) * sizeof(float);
  for (float** p : {&m->params_, &m->grads_, &m->m_, &m->v_}) {
    ASSIGN_OR_RETURN(void* d, ctx.allocator().Allocate(bytes));
    *p = static_cast<float*>(d);
    RETURN_IF_ERROR(Cuda(cudaMemsetAsync(*p, 0, bytes, S(ctx)), "memset"));
  }
  if (cfg.arch == GptConfig::Arch::kLlama) {
    const kernels::RopeTable t = kernels::MakeRopeTable(
        kernels::RopeInvFreq(cfg.head_dim(), cfg.rope_theta, cfg.rope_scaling), cfg.context);
    const size_t half = t.cos.size() * sizeof(float);
    ASSIGN_OR_RETURN(void* d, ctx.allocator().Allocate(2 * half));
    m->rope_ = static_cast<float*>(d);
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(m->rope_, t.cos.data(), half, cudaMemcpyHostToDevice,
                                         S(ctx)), "RoPE table upload"));
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(m->rope_ + t.cos.size(), t.sin.data(), half,
                                         cudaMemcpyHostToDevice, S(ctx)), "RoPE table upload"));
  }
  RETURN_IF_ERROR(ctx.Synchronize());  // the host table goes out of scope
  return m;
}

absl::Status GptCuda::Upload(const float* host, int64_t n, float* arena, const char* what) {
  if (n != layout_.host_total) {
    return absl::InvalidArgumentError(absl::StrCat("GptCuda: ", what, " of ", n,
                                                   " floats, the model has ", layout_.host_total));
  }
  for (size_t i = 0; i < layout_.offset.size(); ++i) {
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(arena + layout_.offset[i], host + layout_.host_offset[i],
                                         layout_.numel[i] * sizeof(float), cudaMemcpyHostToDevice,
                                         S(ctx_)), what));
  }
  return ctx_.Synchronize();
}

absl::Status GptCuda::UploadParams(const float* host, int64_t n) {
  return Upload(host, n, params_, "parameter upload");
}

absl::Status GptCuda::UploadOptimizerState(const float* exp_avg, const float* exp_avg_sq,
                                           int64_t n, int64_t step) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("GptCuda: optimizer step ", step, " < 0"));
  RETURN_IF_ERROR(Upload(exp_avg, n, m_, "exp_avg upload"));
  RETURN_IF_ERROR(Upload(exp_avg_sq, n, v_, "exp_avg_sq upload"));
  step_ = step;
  return absl::OkStatus();
}

absl::Status GptCuda::UploadParams(Gpt& model) {
  if (ParamSpecs(model.config()).size() != layout_.offset.size() ||
      model.num_params() != layout_.host_total) {
    return absl::InvalidArgumentError(
        "GptCuda::UploadParams: the CPU model's config differs from this one's");
  }
  return UploadParams(model.params_flat(), model.num_params());
}

absl::Status GptCuda::Copy(float* host, int64_t n, const float* arena) {
  if (n != layout_.host_total) {
    return absl::InvalidArgumentError(absl::StrCat("GptCuda: download of ", n,
                                                   " floats, the model has ", layout_.host_total));
  }
  for (size_t i = 0; i < layout_.offset.size(); ++i) {
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(host + layout_.host_offset[i], arena + layout_.offset[i],
                                         layout_.numel[i] * sizeof(float), cudaMemcpyDeviceToHost,
                                         S(ctx_)), "download"));
  }
  return ctx_.Synchronize();
}
absl::Status GptCuda::DownloadParams(float* host, int64_t n) { return Copy(host, n, params_); }
absl::Status GptCuda::DownloadGrads(float* host, int64_t n) { return Copy(host, n, grads_); }
absl::Status GptCuda::DownloadOptimizerState(float* exp_avg, float* exp_avg_sq, int64_t n) {
  RETURN_IF_ERROR(Copy(exp_avg, n, m_));
  return Copy(exp_avg_sq, n, v_);
}

absl::Status GptCuda::ZeroGrad() {
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(grads_, 0, layout_.total * sizeof(float), S(ctx_)),
                       "ZeroGrad"));
  return ctx_.Synchronize();
}

absl::Status GptCuda::EnsureActivations(int64_t B, int64_t T) {
  if (acts_ != nullptr && act_.B == B && act_.T == T) return absl::OkStatus();
  ASSIGN_OR_RETURN(GptCudaActLayout plan, PlanGptCudaActivations(cfg_, B, T));
  RETURN_IF_ERROR(ctx_.Synchronize());  // the old arena may still be in use
  RETURN_IF_ERROR(ctx_.allocator().Free(acts_));
  acts_ = nullptr;
  ASSIGN_OR_RETURN(void* d, ctx_.allocator().Allocate(plan.total * sizeof(float)));
  acts_ = static_cast<float*>(d);
  act_ = std::move(plan);
  std::vector<int32_t> pos(B * T);
  for (int64_t n = 0; n < B * T; ++n) pos[n] = static_cast<int32_t>(n % T);
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(acts_ + act_.pos, pos.data(), pos.size() * 4,
                                       cudaMemcpyHostToDevice, S(ctx_)), "positions upload"));
  return ctx_.Synchronize();
}

absl::Status GptCuda::BlockForward(int64_t l, int64_t B, int64_t T) {
  const GptCudaLayerActs& a = act_.layers[l];
  float* A = acts_;
  const std::vector<int>& w = block_index_[l];
  auto W = [&](int k) { return params_ + layout_.offset[w[k]]; };
  const int64_t N = B * T, C = cfg_.d_model, F = cfg_.ff(), Q = cfg_.qkv_width();
  const int64_t KC = cfg_.kv_heads() * cfg_.head_dim();
  const bool swiglu = cfg_.mlp == GptConfig::Mlp::kSwiGlu;
  const int64_t F1 = swiglu ? 2 * F : F;
  float* y = A + (l + 1 < cfg_.n_layer ? act_.layers[l + 1].x : act_.xf);
  const float* x = A + a.x;
  float *qkv = A + a.qkv, *att = A + a.att, *xmid = A + a.xmid;
  RETURN_IF_ERROR(cu::RmsNormForward(ctx_, x, W(kLn1), N, C, cfg_.norm_eps, A + a.ln1, A + a.rstd1));
  RETURN_IF_ERROR(Linear(ctx_, A + a.ln1, W(kQkv), N, C, Q, qkv));
  const cu::RopeDeviceTable rope{rope_, rope_ + cfg_.context * (cfg_.head_dim() / 2), cfg_.context,
                                 cfg_.head_dim() / 2};
  if (rope_ != nullptr) {
    RETURN_IF_ERROR(cu::RopeForward(ctx_, rope, qkv, B, T, cfg_.n_head + cfg_.kv_heads(),
                                    cfg_.head_dim(), Q));
  }
  const kernels::AttentionShape as{B, T, cfg_.n_head, cfg_.head_dim(), cfg_.window, cfg_.kv_heads()};
  RETURN_IF_ERROR(cu::AttentionForward(ctx_, as, qkv, qkv + C, qkv + C + KC, Q, att, C, A + a.lse));
  RETURN_IF_ERROR(Linear(ctx_, att, W(kProj), N, C, C, xmid));
  RETURN_IF_ERROR(cu::AddInPlace(ctx_, x, xmid, N * C));
  RETURN_IF_ERROR(cu::RmsNormForward(ctx_, xmid, W(kLn2), N, C, cfg_.norm_eps, A + a.ln2, A + a.rstd2));
  RETURN_IF_ERROR(Linear(ctx_, A + a.ln2, W(kFc1), N, C, F1, A + a.fc1));
  if (swiglu) {
    RETURN_IF_ERROR(cu::SwiGluForward(ctx_, A + a.fc1, N, F, A + a.act));
  } else {
    RETURN_IF_ERROR(cu::GeluForward(ctx_, A + a.fc1, A + a.act, N * F));
  }
  RETURN_IF_ERROR(Linear(ctx_, A + a.act, W(kFc2), N, F, C, y));
  return cu::AddInPlace(ctx_, xmid, y, N * C);  // y = xmid + mlp (the CPU's Add)
}

absl::Status GptCuda::BlockBackward(int64_t l, int64_t B, int64_t T) {
  const GptCudaLayerActs& a = act_.layers[l];
  float* A = acts_;
  const std::vector<int>& w = block_index_[l];
  auto W = [&](int k) { return params_ + layout_.offset[w[k]]; };
  auto G = [&](int k) { return grads_ + layout_.offset[w[k]]; };
  const int64_t N = B * T, C = cfg_.d_model, F = cfg_.ff(), Q = cfg_.qkv_width();
  const int64_t KC = cfg_.kv_heads() * cfg_.head_dim();
  const bool swiglu = cfg_.mlp == GptConfig::Mlp::kSwiGlu;
  const int64_t F1 = swiglu ? 2 * F : F;
  // dr: the residual gradient, in place in act_.dx (the CPU's dres; dx aliases dy there).
  float *dr = A + act_.dx, *dln = A + act_.dln, *tmp = A + act_.tmp, *dqkv = A + act_.dqkv;
  RETURN_IF_ERROR(LinearBack(ctx_, A + a.act, W(kFc2), dr, N, F, C, A + act_.dact, G(kFc2)));
  if (swiglu) {
    RETURN_IF_ERROR(cu::SwiGluBackward(ctx_, A + a.fc1, A + act_.dact, N, F, A + act_.dfc1));
  } else {
    RETURN_IF_ERROR(cu::GeluBackward(ctx_, A + a.fc1, A + act_.dact, A + act_.dfc1, N * F));
  }
  RETURN_IF_ERROR(LinearBack(ctx_, A + a.ln2, W(kFc1), A + act_.dfc1, N, C, F1, dln, G(kFc1)));
  RETURN_IF_ERROR(cu::RmsNormBackward(ctx_, A + a.xmid, W(kLn2), A + a.rstd2, dln, N, C, tmp, G(kLn2)));
  RETURN_IF_ERROR(cu::AddInPlace(ctx_, tmp, dr, N * C));
  RETURN_IF_ERROR(LinearBack(ctx_, A + a.att, W(kProj), dr, N, C, C, A + act_.datt, G(kProj)));
  const kernels::AttentionShape as{B, T, cfg_.n_head, cfg_.head_dim(), cfg_.window, cfg_.kv_heads()};
  const float* qkv = A + a.qkv;
  RETURN_IF_ERROR(cu::AttentionBackward(ctx_, as, qkv, qkv + C, qkv + C + KC, Q, A + a.att,
                                        A + act_.datt, C, A + a.lse, dqkv, dqkv + C, dqkv + C + KC));
  if (rope_ != nullptr) {
    const cu::RopeDeviceTable rope{rope_, rope_ + cfg_.context * (cfg_.head_dim() / 2),
                                   cfg_.context, cfg_.head_dim() / 2};
    RETURN_IF_ERROR(cu::RopeBackward(ctx_, rope, dqkv, B, T, cfg_.n_head + cfg_.kv_heads(),
                                     cfg_.head_dim(), Q));
  }
  RETURN_IF_ERROR(LinearBack(ctx_, A + a.ln1, W(kQkv), dqkv, N, C, Q, dln, G(kQkv)));
  RETURN_IF_ERROR(cu::RmsNormBackward(ctx_, A + a.x, W(kLn1), A + a.rstd1, dln, N, C, tmp, G(kLn1)));
  return cu::AddInPlace(ctx_, tmp, dr, N * C);  // dx = tmp + dres
}

absl::StatusOr<float> GptCuda::ForwardBackward(const int32_t* tokens, const int32_t* targets,
                                               int64_t B, int64_t T, float grad_scale) {
  if (!(grad_scale > 0) || !std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat("GptCuda: grad_scale ", grad_scale, " (want a finite value > 0)"));
  }
  if (B < 1 || T < 1 || T > cfg_.context) {
    return absl::InvalidArgumentError(absl::StrCat("GptCuda: batch ", B, "x", T, " vs context ", cfg_.context));
  }
  const int64_t N = B * T, C = cfg_.d_model, V = cfg_.vocab_size;
  for (int64_t n = 0; n < N; ++n) {
    if (tokens[n] < 0 || tokens[n] >= V)
      return absl::InvalidArgumentError(absl::StrCat("token ", tokens[n], " at ", n, " outside [0, ", V, ")"));
    if ((targets[n] < 0 || targets[n] >= V) && targets[n] != cfg_.loss.ignore_index) {
      return absl::InvalidArgumentError(absl::StrCat("target ", targets[n], " at ", n, " outside [0, ", V,
                                                     ") and not ignore_index ", cfg_.loss.ignore_index));
    }
  }
  RETURN_IF_ERROR(EnsureActivations(B, T));
  float* A = acts_;
  auto ids = [&](int64_t off) { return reinterpret_cast<int32_t*>(A + off); };
  auto P = [&](int i) { return params_ + layout_.offset[i]; };
  auto G = [&](int i) { return grads_ + layout_.offset[i]; };
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(ids(act_.tokens), tokens, N * 4, cudaMemcpyHostToDevice,
                                       S(ctx_)), "tokens upload"));
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(ids(act_.targets), targets, N * 4, cudaMemcpyHostToDevice,
                                       S(ctx_)), "targets upload"));
  float* x0 = A + act_.layers[0].x;
  RETURN_IF_ERROR(cu::EmbeddingForward(ctx_, ids(act_.tokens), N, P(wte_), C, x0, false));
  if (wpe_ >= 0) RETURN_IF_ERROR(cu::EmbeddingForward(ctx_, ids(act_.pos), N, P(wpe_), C, x0, true));
  for (int64_t l = 0; l < cfg_.n_layer; ++l) RETURN_IF_ERROR(BlockForward(l, B, T));
  // HeadLoss: ln_f, the fused loss (gradient into dlnf and the head weight), ln_f's backward.
  RETURN_IF_ERROR(cu::RmsNormForward(ctx_, A + act_.xf, P(lnf_), N, C, cfg_.norm_eps, A + act_.lnf,
                                     A + act_.rstdf));
  ASSIGN_OR_RETURN(kernels::LceResult lce,
                   cu::FusedLinearCrossEntropy(ctx_, cfg_.loss, A + act_.lnf, P(head_),
                                               ids(act_.targets), N, C, V, A + act_.dlnf, G(head_),
                                               grad_scale));
  RETURN_IF_ERROR(cu::RmsNormBackward(ctx_, A + act_.xf, P(lnf_), A + act_.rstdf, A + act_.dlnf, N,
                                      C, A + act_.dx, G(lnf_)));
  for (int64_t l = cfg_.n_layer; l-- > 0;) RETURN_IF_ERROR(BlockBackward(l, B, T));
  RETURN_IF_ERROR(cu::EmbeddingBackward(ctx_, ids(act_.tokens), N, A + act_.dx, C, G(wte_)));
  if (wpe_ >= 0) RETURN_IF_ERROR(cu::EmbeddingBackward(ctx_, ids(act_.pos), N, A + act_.dx, C, G(wpe_)));
  RETURN_IF_ERROR(ctx_.Synchronize());
  return static_cast<float>(lce.loss);
}

absl::StatusOr<double> GptCuda::AdamWStep(const kernels::AdamWOptions& opt, double clip_norm) {
  double norm = 0;
  if (clip_norm > 0) {
    std::vector<std::pair<float*, int64_t>> gs;
    for (size_t i = 0; i < layout_.offset.size(); ++i)
      gs.push_back({grads_ + layout_.offset[i], layout_.numel[i]});
    ASSIGN_OR_RETURN(norm, cu::ClipGradNorm(ctx_, gs, clip_norm));
  }
  std::vector<cu::AdamWTensor> ts;
  for (size_t i = 0; i < layout_.offset.size(); ++i) {
    const int64_t o = layout_.offset[i];
    ts.push_back({params_ + o, grads_ + o, m_ + o, v_ + o, layout_.numel[i]});
  }
  RETURN_IF_ERROR(cu::AdamWStep(ctx_, opt, step_ + 1, ts));
  ++step_;
  RETURN_IF_ERROR(ctx_.Synchronize());
  return norm;
}

#endif  // EMBER_WITH_CUDA

}  // namespace ember::model
