#include "runtime/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/ops.h"
#include "runtime/base/status_macros.h"
#include "runtime/model/driver.h"

namespace ember::model {

using kernels::DType;
using kernels::ExecContext;
using kernels::Tensor;

namespace {

Tensor F32(std::vector<int64_t> shape) { return Tensor::Empty(DType::kF32, std::move(shape)); }

// Indices of the block's parameters, in BlockParamSpecs order.
enum BlockParam { kLn1 = 0, kQkv, kProj, kLn2, kFc1, kFc2, kGate = 4 };

// One cos/sin table per distinct (head_dim, theta, scaling, context) in the process, shared by
// every block (a table is context * head_dim floats).
std::shared_ptr<const kernels::RopeTable> SharedRopeTable(const GptConfig& cfg) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, std::shared_ptr<const kernels::RopeTable>>;
  const auto& r = cfg.rope_scaling;
  auto bits = [](float f) {  // exact: StrCat would print 6 significant digits
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  const std::string key = absl::StrCat(cfg.head_dim(), "/", bits(cfg.rope_theta), "/", r.llama3, "/",
                                       bits(r.factor), "/", bits(r.low_freq_factor), "/",
                                       bits(r.high_freq_factor), "/", r.original_max_position, "/",
                                       cfg.context);
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*cache)[key];
  if (slot == nullptr) {
    slot = std::make_shared<const kernels::RopeTable>(kernels::MakeRopeTable(
        kernels::RopeInvFreq(cfg.head_dim(), cfg.rope_theta, cfg.rope_scaling), cfg.context));
  }
  return slot;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Block

struct ExpertActs {
  std::vector<int64_t> rows;  // tokens routed here, ascending
  std::vector<int> slot;      // which of the token's top-k slots
  Tensor h, a, y;             // fc1 output [Ne,F], GELU(h), fc2 output [Ne,C]
};

struct BlockActivations {
  int64_t B = 0, T = 0;
  Tensor x, ln1, rstd1, qkv, att, lse, xmid, ln2, rstd2, fc1, act;
  // MoE
  std::vector<int32_t> topk_idx;  // [N, k]
  std::vector<float> topk_w;      // [N, k]
  std::vector<ExpertActs> experts;
};

void BlockActivationsDeleter::operator()(BlockActivations* a) const { delete a; }

Block::Block(const GptConfig& cfg, int64_t layer) : cfg_(cfg), layer_(layer) {
  if (cfg.arch == GptConfig::Arch::kLlama) rope_ = SharedRopeTable(cfg);
}

absl::StatusOr<BlockActivationsPtr> Block::Forward(const ExecContext& ctx,
                                                   absl::Span<const float* const> w,
                                                   const float* x, float* y, int64_t B,
                                                   int64_t T) const {
  const size_t want = BlockParamSpecs(cfg_, layer_).size();
  if (w.size() != want)
    return absl::InvalidArgumentError(absl::StrCat("Block ", layer_, ": ", w.size(), " params, want ", want));
  const int64_t N = B * T, C = cfg_.d_model, F = cfg_.ff();
  BlockActivationsPtr a(new BlockActivations);
  a->B = B;
  a->T = T;
  a->x = F32({N, C});
  std::memcpy(a->x.data<float>(), x, N * C * sizeof(float));
  // Attention half.
  a->ln1 = F32({N, C});
  a->rstd1 = F32({N});
  kernels::RmsNormForward(ctx, x, w[kLn1], N, C, cfg_.norm_eps, a->ln1.data<float>(), a->rstd1.data<float>());
  const int64_t Q = cfg_.qkv_width(), KC = cfg_.kv_heads() * cfg_.head_dim();
  if (rope_ != nullptr && T > rope_->T)
    return absl::InvalidArgumentError(absl::StrCat("Block ", layer_, ": T ", T, " > context ", rope_->T));
  a->qkv = F32({N, Q});
  kernels::LinearForward(ctx, a->ln1.data<float>(), w[kQkv], nullptr, N, C, Q, a->qkv.data<float>());
  // llama: rotate q and k (the first H + KV heads of each row) in place; qkv keeps rotated values.
  if (rope_ != nullptr)
    kernels::RopeForward(ctx, *rope_, a->qkv.data<float>(), B, T, cfg_.n_head + cfg_.kv_heads(), cfg_.head_dim(), Q);
  a->att = F32({N, C});
  a->lse = F32({B, cfg_.n_head, T});
  kernels::AttentionShape as{B, T, cfg_.n_head, cfg_.head_dim(), cfg_.window, cfg_.kv_heads()};
  const float* qkv = a->qkv.data<float>();
  kernels::AttentionForward(ctx, as, qkv, qkv + C, qkv + C + KC, Q, a->att.data<float>(), C,
                            a->lse.data<float>());
  a->xmid = F32({N, C});
  float* xmid = a->xmid.data<float>();
  kernels::LinearForward(ctx, a->att.data<float>(), w[kProj], nullptr, N, C, C, xmid);
  kernels::AddInPlace(ctx, x, xmid, N * C);
  // MLP half.
  a->ln2 = F32({N, C});
  a->rstd2 = F32({N});
  const float* ln2 = a->ln2.data<float>();
  kernels::RmsNormForward(ctx, xmid, w[kLn2], N, C, cfg_.norm_eps, a->ln2.data<float>(), a->rstd2.data<float>());
  Tensor out = F32({N, C});
  if (cfg_.mlp != GptConfig::Mlp::kMoe) {
    const bool swiglu = cfg_.mlp == GptConfig::Mlp::kSwiGlu;
    const int64_t F1 = swiglu ? 2 * F : F;
    a->fc1 = F32({N, F1});
    kernels::LinearForward(ctx, ln2, w[kFc1], nullptr, N, C, F1, a->fc1.data<float>());
    a->act = F32({N, F});
    if (swiglu) {
      kernels::SwiGluForward(ctx, a->fc1.data<float>(), N, F, a->act.data<float>());
    } else {
      kernels::GeluForward(ctx, a->fc1.data<float>(), a->act.data<float>(), N * F);
    }
    kernels::LinearForward(ctx, a->act.data<float>(), w[kFc2], nullptr, N, F, C, out.data<float>());
  } else {
    const int64_t E = cfg_.n_expert, K = cfg_.top_k;
    std::vector<float> logits(N * E);
    kernels::LinearForward(ctx, ln2, w[kGate], nullptr, N, C, E, logits.data());
    a->topk_idx.resize(N * K);
    a->topk_w.resize(N * K);
    a->experts.resize(E);
    for (int64_t n = 0; n < N; ++n) {
      std::vector<int32_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      const float* z = &logits[n * E];
      std::partial_sort(order.begin(), order.begin() + K, order.end(),
                        [&](int32_t i, int32_t j) { return z[i] > z[j] || (z[i] == z[j] && i < j); });
      float mx = z[order[0]], sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += std::exp(z[order[k]] - mx);
      for (int64_t k = 0; k < K; ++k) {
        a->topk_idx[n * K + k] = order[k];
        a->topk_w[n * K + k] = std::exp(z[order[k]] - mx) / sum;
        a->experts[order[k]].rows.push_back(n);
        a->experts[order[k]].slot.push_back(static_cast<int>(k));
      }
    }
    std::memset(out.data<float>(), 0, N * C * sizeof(float));
    for (int64_t e = 0; e < E; ++e) {
      ExpertActs& ex = a->experts[e];
      const int64_t Ne = ex.rows.size();
      if (Ne == 0) continue;
      Tensor xe = F32({Ne, C});
      for (int64_t r = 0; r < Ne; ++r)
        std::memcpy(xe.data<float>() + r * C, ln2 + ex.rows[r] * C, C * sizeof(float));
      ex.h = F32({Ne, F});
      ex.a = F32({Ne, F});
      ex.y = F32({Ne, C});
      kernels::LinearForward(ctx, xe.data<float>(), w[kGate + 1 + 2 * e], nullptr, Ne, C, F, ex.h.data<float>());
      kernels::GeluForward(ctx, ex.h.data<float>(), ex.a.data<float>(), Ne * F);
      kernels::LinearForward(ctx, ex.a.data<float>(), w[kGate + 2 + 2 * e], nullptr, Ne, F, C, ex.y.data<float>());
      for (int64_t r = 0; r < Ne; ++r) {
        const float wt = a->topk_w[ex.rows[r] * K + ex.slot[r]];
        const float* src = ex.y.data<float>() + r * C;
        float* dst = out.data<float>() + ex.rows[r] * C;
        for (int64_t c = 0; c < C; ++c) dst[c] += wt * src[c];
      }
    }
  }
  kernels::Add(ctx, xmid, out.data<float>(), y, N * C);
  return a;
}

// One deferred linear weight gradient: dW[k] += dy[N,out]^T x[N,in].
struct DeferredLinear {
  int k = 0;
  Tensor x, dy;
  int64_t N = 0, in = 0, out = 0;
};

struct BlockWeightGrads {
  std::vector<DeferredLinear> linears;
};

void BlockWeightGradsDeleter::operator()(BlockWeightGrads* w) const { delete w; }

absl::Status Block::Backward(const ExecContext& ctx, absl::Span<const float* const> w,
                             absl::Span<float* const> g, BlockActivationsPtr a, const float* dy,
                             float* dx) const {
  return BackwardImpl(ctx, w, g, std::move(a), dy, dx, nullptr);
}

absl::StatusOr<BlockWeightGradsPtr> Block::BackwardInput(const ExecContext& ctx,
                                                         absl::Span<const float* const> w,
                                                         absl::Span<float* const> g,
                                                         BlockActivationsPtr a, const float* dy,
                                                         float* dx) const {
  BlockWeightGradsPtr saved(new BlockWeightGrads);
  RETURN_IF_ERROR(BackwardImpl(ctx, w, g, std::move(a), dy, dx, saved.get()));
  return saved;
}

absl::Status Block::BackwardWeight(const ExecContext& ctx, absl::Span<float* const> g,
                                   BlockWeightGradsPtr saved) const {
  if (saved == nullptr || g.size() != BlockParamSpecs(cfg_, layer_).size())
    return absl::InvalidArgumentError(absl::StrCat("Block ", layer_, ": bad BackwardWeight arguments"));
  // In Backward's order, so each gradient sees the same sequence of accumulations.
  for (DeferredLinear& d : saved->linears) {
    kernels::LinearBackward(ctx, d.x.data<float>(), nullptr, d.dy.data<float>(), d.N, d.in, d.out,
                            nullptr, g[d.k], nullptr);
    d = DeferredLinear{};
  }
  return absl::OkStatus();
}

absl::Status Block::BackwardImpl(const ExecContext& ctx, absl::Span<const float* const> w,
                                 absl::Span<float* const> g, BlockActivationsPtr a,
                                 const float* dy, float* dx, BlockWeightGrads* defer) const {
  const size_t want = BlockParamSpecs(cfg_, layer_).size();
  if (w.size() != want || g.size() != want || a == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("Block ", layer_, ": bad Backward arguments"));
  const int64_t B = a->B, T = a->T, N = B * T, C = cfg_.d_model, F = cfg_.ff();
  // The backward of linear k (input x[n,in], output gradient dyt[n,out]) into dxp; its weight
  // gradient now, or saved in `defer` (dyt copied when the caller changes it afterwards).
  auto linear = [&](const Tensor& x, int k, const Tensor& dyt, bool dy_changes, int64_t n,
                    int64_t in, int64_t out, float* dxp) {
    kernels::LinearBackward(ctx, x.data<float>(), w[k], dyt.data<float>(), n, in, out, dxp,
                            defer ? nullptr : g[k], nullptr);
    if (defer == nullptr) return;
    Tensor saved_dy = dyt;
    if (dy_changes) {
      saved_dy = F32({n, out});
      std::memcpy(saved_dy.data<float>(), dyt.data<float>(), n * out * sizeof(float));
    }
    defer->linears.push_back({k, x, std::move(saved_dy), n, in, out});
  };
  // dres: gradient of the residual stream between the two halves (starts as dy).
  Tensor dres = F32({N, C});
  float* dr = dres.data<float>();
  std::memcpy(dr, dy, N * C * sizeof(float));
  Tensor dln2 = F32({N, C});
  if (cfg_.mlp != GptConfig::Mlp::kMoe) {
    const bool swiglu = cfg_.mlp == GptConfig::Mlp::kSwiGlu;
    const int64_t F1 = swiglu ? 2 * F : F;
    Tensor dact = F32({N, F});
    linear(a->act, kFc2, dres, true, N, F, C, dact.data<float>());
    a->act.Reset();
    Tensor dfc1 = swiglu ? F32({N, F1}) : dact;  // GELU backward runs in place
    if (swiglu) {
      kernels::SwiGluBackward(ctx, a->fc1.data<float>(), dact.data<float>(), N, F, dfc1.data<float>());
    } else {
      kernels::GeluBackward(ctx, a->fc1.data<float>(), dact.data<float>(), dfc1.data<float>(), N * F);
    }
    a->fc1.Reset();
    dact.Reset();
    linear(a->ln2, kFc1, dfc1, false, N, C, F1, dln2.data<float>());
  } else {
    const int64_t E = cfg_.n_expert, K = cfg_.top_k;
    const float* ln2 = a->ln2.data<float>();
    float* dl2 = dln2.data<float>();
    std::memset(dl2, 0, N * C * sizeof(float));
    std::vector<float> dwt(N * K, 0.0f), dlogits(N * E, 0.0f);
    for (int64_t e = 0; e < E; ++e) {
      ExpertActs& ex = a->experts[e];
      const int64_t Ne = ex.rows.size();
      if (Ne == 0) continue;
      Tensor dye = F32({Ne, C}), xe = F32({Ne, C}), da = F32({Ne, F}), dxe = F32({Ne, C});
      for (int64_t r = 0; r < Ne; ++r) {
        const int64_t n = ex.rows[r];
        const float wt = a->topk_w[n * K + ex.slot[r]];
        const float* dyr = dr + n * C;
        const float* yr = ex.y.data<float>() + r * C;
        float dot = 0;
        for (int64_t c = 0; c < C; ++c) dot += dyr[c] * yr[c];
        dwt[n * K + ex.slot[r]] = dot;
        for (int64_t c = 0; c < C; ++c) dye.data<float>()[r * C + c] = wt * dyr[c];
        std::memcpy(xe.data<float>() + r * C, ln2 + n * C, C * sizeof(float));
      }
      ex.y.Reset();
      linear(ex.a, kGate + 2 + 2 * e, dye, false, Ne, F, C, da.data<float>());
      ex.a.Reset();
      kernels::GeluBackward(ctx, ex.h.data<float>(), da.data<float>(), da.data<float>(), Ne * F);
      ex.h.Reset();
      linear(xe, kGate + 1 + 2 * e, da, false, Ne, C, F, dxe.data<float>());
      for (int64_t r = 0; r < Ne; ++r)
        kernels::AddInPlace(ExecContext{}, dxe.data<float>() + r * C, dl2 + ex.rows[r] * C, C);
    }
    // Router: weights are a softmax over the selected logits.
    for (int64_t n = 0; n < N; ++n) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += a->topk_w[n * K + k] * dwt[n * K + k];
      for (int64_t k = 0; k < K; ++k)
        dlogits[n * E + a->topk_idx[n * K + k]] = a->topk_w[n * K + k] * (dwt[n * K + k] - s);
    }
    Tensor dgate = F32({N, C});
    linear(a->ln2, kGate, Tensor::Borrow(dlogits.data(), DType::kF32, {N, E}), true, N, C, E,
           dgate.data<float>());
    kernels::AddInPlace(ctx, dgate.data<float>(), dl2, N * C);
    a->experts.clear();
  }
  a->ln2.Reset();
  {
    Tensor tmp = F32({N, C});
    kernels::RmsNormBackward(ctx, a->xmid.data<float>(), w[kLn2], a->rstd2.data<float>(),
                             dln2.data<float>(), N, C, tmp.data<float>(), g[kLn2]);
    kernels::AddInPlace(ctx, tmp.data<float>(), dr, N * C);
  }
  dln2.Reset();
  a->xmid.Reset();
  a->rstd2.Reset();
  // Attention half.
  Tensor datt = F32({N, C});
  linear(a->att, kProj, dres, false, N, C, C, datt.data<float>());
  const int64_t Q = cfg_.qkv_width(), KC = cfg_.kv_heads() * cfg_.head_dim();
  Tensor dqkv = F32({N, Q});
  kernels::AttentionShape as{B, T, cfg_.n_head, cfg_.head_dim(), cfg_.window, cfg_.kv_heads()};
  const float* qkv = a->qkv.data<float>();
  float* dq = dqkv.data<float>();
  kernels::AttentionBackward(ctx, as, qkv, qkv + C, qkv + C + KC, Q, a->att.data<float>(),
                             datt.data<float>(), C, a->lse.data<float>(), dq, dq + C, dq + C + KC);
  a->att.Reset();
  a->lse.Reset();
  datt.Reset();
  // llama: gradients w.r.t. the rotated q and k back to the projection's outputs.
  if (rope_ != nullptr)
    kernels::RopeBackward(ctx, *rope_, dq, B, T, cfg_.n_head + cfg_.kv_heads(), cfg_.head_dim(), Q);
  Tensor dln1 = F32({N, C});
  linear(a->ln1, kQkv, dqkv, false, N, C, Q, dln1.data<float>());
  a->qkv.Reset();
  a->ln1.Reset();
  dqkv.Reset();
  Tensor tmp = F32({N, C});
  kernels::RmsNormBackward(ctx, a->x.data<float>(), w[kLn1], a->rstd1.data<float>(), dln1.data<float>(),
                           N, C, tmp.data<float>(), g[kLn1]);
  a.reset();
  kernels::Add(ctx, tmp.data<float>(), dr, dx, N * C);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Gpt

Gpt::Gpt(const GptConfig& cfg) : cfg_(cfg) {}
Gpt::~Gpt() = default;

absl::StatusOr<std::unique_ptr<Gpt>> Gpt::Create(const GptConfig& cfg, uint64_t seed) {
  RETURN_IF_ERROR(cfg.Validate());
  std::unique_ptr<Gpt> m(new Gpt(cfg));
  m->specs_ = ParamSpecs(cfg);
  int64_t total = 0;
  for (const auto& s : m->specs_) {
    m->offsets_.push_back(total);
    total += s.numel();
  }
  m->params_ = Tensor::Empty(DType::kF32, {total});
  m->grads_ = Tensor::Zeros(DType::kF32, {total});
  for (size_t i = 0; i < m->specs_.size(); ++i) InitParam(m->specs_[i], seed, 0, m->specs_[i].numel(), m->param(i));
  {
    std::shared_ptr<const Model> gm = MakeGptModel(cfg);
    const Part whole = Part::Whole(*gm);
    m->driver_ = std::make_unique<const Driver>(std::move(gm), whole);
  }
  return m;
}

int Gpt::FindParam(const std::string& name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return static_cast<int>(i);
  return -1;
}

void Gpt::ZeroGrad() { std::memset(grads_.raw(), 0, grads_.nbytes()); }

absl::StatusOr<float> Gpt::ForwardBackward(const ExecContext& ctx, const int32_t* tokens,
                                           const int32_t* targets, int64_t B, int64_t T) {
  return Run(ctx, tokens, targets, B, T, /*backward=*/true);
}

absl::StatusOr<float> Gpt::Loss(const ExecContext& ctx, const int32_t* tokens,
                                const int32_t* targets, int64_t B, int64_t T) {
  return Run(ctx, tokens, targets, B, T, /*backward=*/false);
}

absl::Status EmbedForward(const ExecContext& ctx, const GptConfig& cfg, const float* wte,
                          const float* wpe, const int32_t* tokens, int64_t B, int64_t T, float* x) {
  const int64_t N = B * T, C = cfg.d_model, V = cfg.vocab_size;
  if (B <= 0 || T <= 0 || T > cfg.context)
    return absl::InvalidArgumentError(absl::StrCat("batch ", B, "x", T, " vs context ", cfg.context));
  for (int64_t n = 0; n < N; ++n)
    if (tokens[n] < 0 || tokens[n] >= V)
      return absl::InvalidArgumentError(absl::StrCat("token ", tokens[n], " at ", n, " outside [0, ", V, ")"));
  kernels::EmbeddingForward(ctx, tokens, N, wte, C, x, false);
  if (cfg.arch == GptConfig::Arch::kLlama) return absl::OkStatus();  // positions come from RoPE
  std::vector<int32_t> pos(N);
  for (int64_t n = 0; n < N; ++n) pos[n] = static_cast<int32_t>(n % T);
  kernels::EmbeddingForward(ctx, pos.data(), N, wpe, C, x, true);
  return absl::OkStatus();
}

void EmbedBackward(const ExecContext& ctx, const GptConfig& cfg, const int32_t* tokens, int64_t B,
                   int64_t T, const float* dx, float* g_wte, float* g_wpe) {
  const int64_t N = B * T, C = cfg.d_model;
  kernels::EmbeddingBackward(ctx, tokens, N, dx, C, g_wte);
  if (cfg.arch == GptConfig::Arch::kLlama) return;
  std::vector<int32_t> pos(N);
  for (int64_t n = 0; n < N; ++n) pos[n] = static_cast<int32_t>(n % T);
  kernels::EmbeddingBackward(ctx, pos.data(), N, dx, C, g_wpe);
}

absl::StatusOr<float> HeadLoss(const ExecContext& ctx, const GptConfig& cfg, const float* w_lnf,
                               const float* wte, const float* x, const int32_t* targets, int64_t B,
                               int64_t T, float dloss, Tensor* dx, float* g_lnf, float* g_wte) {
  const int64_t N = B * T, C = cfg.d_model, V = cfg.vocab_size;
  const bool backward = dx != nullptr;
  Tensor y = F32({N, C}), rstd = F32({N});
  kernels::RmsNormForward(ctx, x, w_lnf, N, C, cfg.norm_eps, y.data<float>(), rstd.data<float>());
  Tensor dy = backward ? F32({N, C}) : Tensor();
  ASSIGN_OR_RETURN(kernels::LceResult lce,
                   kernels::FusedLinearCrossEntropy(ctx, cfg.loss, y.data<float>(), wte, targets, N, C, V,
                                                    backward ? dy.data<float>() : nullptr,
                                                    backward ? g_wte : nullptr, dloss));
  if (backward) {
    y.Reset();
    *dx = F32({N, C});
    kernels::RmsNormBackward(ctx, x, w_lnf, rstd.data<float>(), dy.data<float>(), N, C,
                             dx->data<float>(), g_lnf);
  }
  return static_cast<float>(lce.loss);
}

absl::StatusOr<float> Gpt::Run(const ExecContext& ctx, const int32_t* tokens,
                               const int32_t* targets, int64_t B, int64_t T, bool backward) {
  const int64_t base = kernels::MemoryStats::live_bytes();
  kernels::MemoryStats::ResetPeak();
  DenseParams dense(params_.data<float>(), grads_.data<float>(), offsets_);
  MicroBatch mb;
  ASSIGN_OR_RETURN(float loss, driver_->Forward(ctx, dense, {.tokens = tokens, .targets = targets, .B = B,
                                                              .T = T, .dloss = 1.0f, .backward = backward},
                                                &mb, nullptr));
  if (backward) RETURN_IF_ERROR(driver_->Backward(ctx, dense, &mb, nullptr, nullptr));
  peak_activation_bytes_ = kernels::MemoryStats::peak_bytes() - base;
  return loss;
}

// ---------------------------------------------------------------------------------------------
// AdamW

AdamW::AdamW(const kernels::AdamWOptions& opt, int64_t num_params, double clip_norm)
    : opt_(opt), clip_norm_(clip_norm), m_(Tensor::Zeros(DType::kF32, {num_params})),
      v_(Tensor::Zeros(DType::kF32, {num_params})) {}

double AdamW::Step(const ExecContext& ctx, Gpt& model) {
  double norm = 0;
  if (clip_norm_ > 0) norm = kernels::ClipGradNorm(ctx, {{model.grads_flat(), model.num_params()}}, clip_norm_);
  ++step_;
  kernels::AdamWStep(ctx, opt_, step_, model.params_flat(), model.grads_flat(), m_.data<float>(),
                     v_.data<float>(), model.num_params());
  return norm;
}

}  // namespace ember::model
