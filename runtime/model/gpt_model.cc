// GPT and Llama (gpt.h) as a model::Model (model.h): the units over Block, EmbedForward and
// HeadLoss.
#include <map>

#include "absl/strings/str_cat.h"
#include "runtime/model/model.h"

namespace ember::model {
namespace {

struct GptBlockState : UnitState {
  BlockActivationsPtr acts;
  BlockWeightGradsPtr deferred;
};

class GptModel final : public Model {
 public:
  explicit GptModel(const GptConfig& cfg) : cfg_(cfg), specs_(model::ParamSpecs(cfg)) {
    std::map<std::string, int> index;
    for (size_t i = 0; i < specs_.size(); ++i) index[specs_[i].name] = static_cast<int>(i);
    auto at = [&](const std::string& name) {
      auto it = index.find(name);
      return it == index.end() ? -1 : it->second;
    };
    std::vector<int> embed{at("wte.weight")};
    if (cfg.arch == GptConfig::Arch::kGpt) embed.push_back(at("wpe.weight"));
    units_.push_back(embed);
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
      std::vector<int> u;
      for (const ParamSpec& s : BlockParamSpecs(cfg, l)) u.push_back(at(s.name));
      units_.push_back(u);
      blocks_.emplace_back(cfg, l);
    }
    units_.push_back({at("ln_f.weight"), at(cfg.tie_embeddings ? "wte.weight" : "lm_head.weight")});
  }

  std::string arch() const override { return cfg_.arch == GptConfig::Arch::kLlama ? "llama" : "gpt"; }
  const std::vector<ParamSpec>& ParamSpecs() const override { return specs_; }
  int NumBlocks() const override { return static_cast<int>(cfg_.n_layer); }
  int64_t Width() const override { return cfg_.d_model; }
  int64_t Context() const override { return cfg_.context; }
  std::vector<int> UnitParams(int unit) const override { return units_.at(unit); }

  absl::Status EmbedForward(const kernels::ExecContext& ctx, absl::Span<const float* const> w,
                            const int32_t* tokens, int64_t B, int64_t T, float* x) const override {
    return model::EmbedForward(ctx, cfg_, w[0], w.size() > 1 ? w[1] : nullptr, tokens, B, T, x);
  }
  void EmbedBackward(const kernels::ExecContext& ctx, absl::Span<float* const> g, const int32_t* tokens,
                     int64_t B, int64_t T, const float* dx) const override {
    model::EmbedBackward(ctx, cfg_, tokens, B, T, dx, g[0], g.size() > 1 ? g[1] : nullptr);
  }

  absl::StatusOr<UnitStatePtr> BlockForward(const kernels::ExecContext& ctx, int b,
                                            absl::Span<const float* const> w, const float* x, float* y,
                                            int64_t B, int64_t T) const override {
    auto st = std::make_unique<GptBlockState>();
    absl::StatusOr<BlockActivationsPtr> a = blocks_.at(b).Forward(ctx, w, x, y, B, T);
    if (!a.ok()) return a.status();
    st->acts = std::move(*a);
    return UnitStatePtr(std::move(st));
  }
  absl::Status BlockBackward(const kernels::ExecContext& ctx, int b, absl::Span<const float* const> w,
                             absl::Span<float* const> g, UnitStatePtr state, const float* dy,
                             float* dx) const override {
    auto* s = dynamic_cast<GptBlockState*>(state.get());
    if (s == nullptr || s->acts == nullptr) return absl::InternalError(absl::StrCat("block ", b, ": no activations"));
    return blocks_.at(b).Backward(ctx, w, g, std::move(s->acts), dy, dx);
  }
  absl::StatusOr<UnitStatePtr> BlockBackwardInput(const kernels::ExecContext& ctx, int b,
                                                  absl::Span<const float* const> w, absl::Span<float* const> g,
                                                  UnitStatePtr state, const float* dy, float* dx) const override {
    auto* s = dynamic_cast<GptBlockState*>(state.get());
    if (s == nullptr || s->acts == nullptr) return absl::InternalError(absl::StrCat("block ", b, ": no activations"));
    absl::StatusOr<BlockWeightGradsPtr> d = blocks_.at(b).BackwardInput(ctx, w, g, std::move(s->acts), dy, dx);
    if (!d.ok()) return d.status();
    s->deferred = std::move(*d);
    return state;
  }
  absl::Status BlockBackwardWeight(const kernels::ExecContext& ctx, int b, absl::Span<float* const> g,
                                   UnitStatePtr deferred) const override {
    auto* s = dynamic_cast<GptBlockState*>(deferred.get());
    if (s == nullptr || s->deferred == nullptr) return absl::InternalError(absl::StrCat("block ", b, ": nothing deferred"));
    return blocks_.at(b).BackwardWeight(ctx, g, std::move(s->deferred));
  }

  absl::StatusOr<float> HeadLoss(const kernels::ExecContext& ctx, absl::Span<const float* const> w, const float* x,
                                 const int32_t* targets, int64_t B, int64_t T, float dloss, kernels::Tensor* dx,
                                 absl::Span<float* const> g) const override {
    return model::HeadLoss(ctx, cfg_, w[0], w[1], x, targets, B, T, dloss, dx, dx ? g[0] : nullptr,
                           dx ? g[1] : nullptr);
  }

 private:
  const GptConfig cfg_;
  const std::vector<ParamSpec> specs_;
  std::vector<std::vector<int>> units_;
  std::vector<Block> blocks_;
};

}  // namespace

std::shared_ptr<const Model> MakeGptModel(const GptConfig& cfg) { return std::make_shared<const GptModel>(cfg); }

}  // namespace ember::model
