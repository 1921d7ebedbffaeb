#include "runtime/model/driver.h"

#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace ember::model {

using kernels::DType;
using kernels::ExecContext;
using kernels::Tensor;

int UnitCount(const GptConfig& cfg) { return static_cast<int>(cfg.n_layer) + 2; }

std::string UnitName(const GptConfig& cfg, int unit) {
  if (unit == 0) return "embed";
  if (unit == UnitCount(cfg) - 1) return "head";
  return absl::StrCat("blocks.", unit - 1);
}

std::vector<int> UnitParams(const GptConfig& cfg, int unit) {
  const std::vector<ParamSpec> specs = ParamSpecs(cfg);
  std::map<std::string, int> index;
  for (size_t i = 0; i < specs.size(); ++i) index[specs[i].name] = static_cast<int>(i);
  auto at = [&](const std::string& name) {
    auto it = index.find(name);
    return it == index.end() ? -1 : it->second;
  };
  std::vector<int> out;
  if (unit == 0) {
    out.push_back(at("wte.weight"));
    if (cfg.arch == GptConfig::Arch::kGpt) out.push_back(at("wpe.weight"));
  } else if (unit == UnitCount(cfg) - 1) {
    out.push_back(at("ln_f.weight"));
    out.push_back(at(cfg.tie_embeddings ? "wte.weight" : "lm_head.weight"));
  } else {
    for (const ParamSpec& s : BlockParamSpecs(cfg, unit - 1)) out.push_back(at(s.name));
  }
  return out;
}

Part Part::Stage(const GptConfig& cfg, int stage, int stages) {
  const int per = static_cast<int>(cfg.n_layer) / stages;
  Part p{1 + stage * per, stage * per + per};
  if (stage == 0) p.first = 0;
  if (stage == stages - 1) p.last = UnitCount(cfg) - 1;
  return p;
}

Driver::Driver(const GptConfig& cfg, Part part) : cfg_(cfg), part_(part) {
  for (int u = part_.first; u <= part_.last; ++u) {
    unit_params_.push_back(UnitParams(cfg_, u));
    if (u >= 1 && u <= cfg_.n_layer) blocks_.emplace_back(cfg_, u - 1);
  }
  const std::vector<int> embed = UnitParams(cfg_, 0), head = UnitParams(cfg_, UnitCount(cfg_) - 1);
  wte_ = embed[0];
  wpe_ = embed.size() > 1 ? embed[1] : -1;
  lnf_ = head[0];
  head_ = head[1];
}

namespace {

Tensor F32(int64_t n, int64_t c) { return Tensor::Empty(DType::kF32, {n, c}); }

}  // namespace

absl::StatusOr<float> Driver::Forward(const ExecContext& ctx, UnitHooks& hooks,
                                      const ForwardArgs& args, MicroBatch* mb, float* y) const {
  const int64_t B = args.B, T = args.T, N = B * T, C = cfg_.d_model;
  if (B <= 0 || T <= 0 || T > cfg_.context)
    return absl::InvalidArgumentError(absl::StrCat("batch ", B, "x", T, " vs context ", cfg_.context));
  const bool head = part_.has_head(cfg_);
  if (part_.has_embed() ? args.tokens == nullptr : args.x == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("units ", part_.first, "..", part_.last, ": no input"));
  if (head ? args.targets == nullptr : y == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("units ", part_.first, "..", part_.last, ": no output"));
  *mb = MicroBatch();
  mb->tokens = args.tokens;
  mb->B = B;
  mb->T = T;
  mb->backward = args.backward;
  Tensor x = F32(N, C);
  if (part_.has_embed()) {
    RETURN_IF_ERROR(hooks.Before(Phase::kForward, 0));
    RETURN_IF_ERROR(EmbedForward(ctx, cfg_, hooks.Weight(wte_), wpe_ < 0 ? nullptr : hooks.Weight(wpe_),
                                 args.tokens, B, T, x.data<float>()));
    RETURN_IF_ERROR(hooks.After(Phase::kForward, 0, x.data<float>(), N * C));
  } else {
    std::memcpy(x.data<float>(), args.x, static_cast<size_t>(N * C) * sizeof(float));
  }
  const int first_block = std::max(part_.first, 1);
  std::vector<const float*> w;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const int u = first_block + static_cast<int>(b);
    RETURN_IF_ERROR(hooks.Before(Phase::kForward, u));
    w.clear();
    for (int p : unit_params_[u - part_.first]) w.push_back(hooks.Weight(p));
    ASSIGN_OR_RETURN(BlockActivationsPtr act,
                     blocks_[b].Forward(ctx, w, x.data<float>(), x.data<float>(), B, T));
    if (args.backward) mb->acts.push_back(std::move(act));
    RETURN_IF_ERROR(hooks.After(Phase::kForward, u, x.data<float>(), N * C));
  }
  if (!head) {
    std::memcpy(y, x.data<float>(), static_cast<size_t>(N * C) * sizeof(float));
    return 0.0f;
  }
  const int h = UnitCount(cfg_) - 1;
  RETURN_IF_ERROR(hooks.Before(Phase::kForward, h));
  absl::StatusOr<float> loss =
      HeadLoss(ctx, cfg_, hooks.Weight(lnf_), hooks.Weight(head_), x.data<float>(), args.targets, B, T,
               args.dloss, args.backward ? &mb->head_dx : nullptr,
               args.backward ? hooks.Grad(lnf_) : nullptr, args.backward ? hooks.Grad(head_) : nullptr);
  if (!loss.ok()) return loss.status();
  RETURN_IF_ERROR(hooks.After(Phase::kForward, h, nullptr, 0));
  return *loss;
}

absl::Status Driver::Backward(const ExecContext& ctx, UnitHooks& hooks, MicroBatch* mb,
                              const float* dy, float* dx, BackwardMode mode) const {
  if (!mb->backward) return absl::FailedPreconditionError("backward of a forward that kept no activations");
  const int64_t N = mb->B * mb->T, C = cfg_.d_model;
  Tensor d;
  if (part_.has_head(cfg_)) {
    const int h = UnitCount(cfg_) - 1;
    if (!mb->head_dx.defined()) return absl::FailedPreconditionError("backward before the loss");
    RETURN_IF_ERROR(hooks.Before(Phase::kBackward, h));
    d = std::move(mb->head_dx);
    RETURN_IF_ERROR(hooks.After(Phase::kBackward, h, nullptr, 0));
  } else {
    if (dy == nullptr) return absl::InvalidArgumentError("backward of a part without the head needs dy");
    d = F32(N, C);
    std::memcpy(d.data<float>(), dy, static_cast<size_t>(N * C) * sizeof(float));
  }
  if (mb->acts.size() != blocks_.size())
    return absl::FailedPreconditionError("backward before its forward (or run twice)");
  const int first_block = std::max(part_.first, 1);
  std::vector<const float*> w;
  std::vector<float*> g;
  for (size_t b = blocks_.size(); b-- > 0;) {
    const int u = first_block + static_cast<int>(b);
    RETURN_IF_ERROR(hooks.Before(Phase::kBackward, u));
    w.clear();
    g.clear();
    for (int p : unit_params_[u - part_.first]) {
      w.push_back(hooks.Weight(p));
      g.push_back(hooks.Grad(p));
    }
    if (mode == BackwardMode::kInputOnly) {
      ASSIGN_OR_RETURN(BlockWeightGradsPtr saved,
                       blocks_[b].BackwardInput(ctx, w, g, std::move(mb->acts[b]), d.data<float>(), d.data<float>()));
      mb->deferred.push_back(std::move(saved));
    } else {
      RETURN_IF_ERROR(blocks_[b].Backward(ctx, w, g, std::move(mb->acts[b]), d.data<float>(), d.data<float>()));
    }
    RETURN_IF_ERROR(hooks.After(Phase::kBackward, u, nullptr, 0));
  }
  mb->acts.clear();
  if (part_.has_embed()) {
    RETURN_IF_ERROR(hooks.Before(Phase::kBackward, 0));
    EmbedBackward(ctx, cfg_, mb->tokens, mb->B, mb->T, d.data<float>(), hooks.Grad(wte_),
                  wpe_ < 0 ? nullptr : hooks.Grad(wpe_));
    return hooks.After(Phase::kBackward, 0, nullptr, 0);
  }
  if (dx == nullptr) return absl::InvalidArgumentError("backward of a part without the embedding needs dx");
  std::memcpy(dx, d.data<float>(), static_cast<size_t>(N * C) * sizeof(float));
  return absl::OkStatus();
}

absl::Status Driver::BackwardWeight(const ExecContext& ctx, UnitHooks& hooks, MicroBatch* mb) const {
  if (mb->deferred.size() != blocks_.size())
    return absl::FailedPreconditionError("weight gradients before the input gradients (or run twice)");
  const int first_block = std::max(part_.first, 1);
  std::vector<float*> g;
  for (size_t j = 0; j < mb->deferred.size(); ++j) {  // last block first, as BackwardInput ran
    const size_t b = blocks_.size() - 1 - j;
    const int u = first_block + static_cast<int>(b);
    RETURN_IF_ERROR(hooks.Before(Phase::kBackwardWeight, u));
    g.clear();
    for (int p : unit_params_[u - part_.first]) g.push_back(hooks.Grad(p));
    RETURN_IF_ERROR(blocks_[b].BackwardWeight(ctx, g, std::move(mb->deferred[j])));
    RETURN_IF_ERROR(hooks.After(Phase::kBackwardWeight, u, nullptr, 0));
  }
  mb->deferred.clear();
  return absl::OkStatus();
}

}  // namespace ember::model
