#include "runtime/model/driver.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace ember::model {

using kernels::DType;
using kernels::ExecContext;
using kernels::Tensor;

int UnitCount(const Model& m) { return m.NumBlocks() + 2; }

std::string UnitName(const Model& m, int unit) {
  if (unit == 0) return "embed";
  if (unit == UnitCount(m) - 1) return "head";
  return absl::StrCat("blocks.", unit - 1);
}

Part Part::Stage(const Model& m, int stage, int stages) {
  const int per = m.NumBlocks() / stages;
  Part p{1 + stage * per, stage * per + per};
  if (stage == 0) p.first = 0;
  if (stage == stages - 1) p.last = UnitCount(m) - 1;
  return p;
}

Driver::Driver(std::shared_ptr<const Model> model, Part part) : model_(std::move(model)), part_(part) {
  for (int u = part_.first; u <= part_.last; ++u) unit_params_.push_back(model_->UnitParams(u));
}

namespace {

Tensor F32(int64_t n, int64_t c) { return Tensor::Empty(DType::kF32, {n, c}); }

}  // namespace

absl::StatusOr<float> Driver::Forward(const ExecContext& ctx, UnitHooks& hooks, const ForwardArgs& args,
                                      MicroBatch* mb, float* y) const {
  const Model& m = *model_;
  const int64_t B = args.B, T = args.T, N = B * T, C = m.Width();
  if (B <= 0 || T <= 0 || T > m.Context())
    return absl::InvalidArgumentError(absl::StrCat("batch ", B, "x", T, " vs context ", m.Context()));
  const bool head = part_.has_head(m);
  if (part_.has_embed() ? args.tokens == nullptr : args.x == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("units ", part_.first, "..", part_.last, ": no input"));
  if (head ? args.targets == nullptr : y == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("units ", part_.first, "..", part_.last, ": no output"));
  *mb = MicroBatch();
  mb->tokens = args.tokens;
  mb->B = B;
  mb->T = T;
  mb->backward = args.backward;
  std::vector<const float*> w;
  auto weights = [&](int u) {
    w.clear();
    for (int p : unit_params_[u - part_.first]) w.push_back(hooks.Weight(p));
    return absl::Span<const float* const>(w);
  };
  Tensor x = F32(N, C);
  if (part_.has_embed()) {
    RETURN_IF_ERROR(hooks.Before(Phase::kForward, 0));
    RETURN_IF_ERROR(m.EmbedForward(ctx, weights(0), args.tokens, B, T, x.data<float>()));
    RETURN_IF_ERROR(hooks.After(Phase::kForward, 0, x.data<float>(), N * C));
  } else {
    std::memcpy(x.data<float>(), args.x, static_cast<size_t>(N * C) * sizeof(float));
  }
  const int first_block = std::max(part_.first, 1), last_block = std::min(part_.last, m.NumBlocks());
  for (int u = first_block; u <= last_block; ++u) {
    RETURN_IF_ERROR(hooks.Before(Phase::kForward, u));
    ASSIGN_OR_RETURN(UnitStatePtr st, m.BlockForward(ctx, u - 1, weights(u), x.data<float>(), x.data<float>(), B, T));
    if (args.backward) mb->acts.push_back(std::move(st));
    RETURN_IF_ERROR(hooks.After(Phase::kForward, u, x.data<float>(), N * C));
  }
  if (!head) {
    std::memcpy(y, x.data<float>(), static_cast<size_t>(N * C) * sizeof(float));
    return 0.0f;
  }
  const int h = UnitCount(m) - 1;
  RETURN_IF_ERROR(hooks.Before(Phase::kForward, h));
  std::vector<float*> g;
  if (args.backward)
    for (int p : unit_params_[h - part_.first]) g.push_back(hooks.Grad(p));
  ASSIGN_OR_RETURN(float loss, m.HeadLoss(ctx, weights(h), x.data<float>(), args.targets, B, T, args.dloss,
                                          args.backward ? &mb->head_dx : nullptr, g));
  RETURN_IF_ERROR(hooks.After(Phase::kForward, h, nullptr, 0));
  return loss;
}

absl::Status Driver::Backward(const ExecContext& ctx, UnitHooks& hooks, MicroBatch* mb, const float* dy,
                              float* dx, BackwardMode mode) const {
  const Model& m = *model_;
  if (!mb->backward) return absl::FailedPreconditionError("backward of a forward that kept no activations");
  const int64_t N = mb->B * mb->T, C = m.Width();
  const int first_block = std::max(part_.first, 1), last_block = std::min(part_.last, m.NumBlocks());
  const size_t blocks = static_cast<size_t>(std::max(0, last_block - first_block + 1));
  Tensor d;
  if (part_.has_head(m)) {
    const int h = UnitCount(m) - 1;
    if (!mb->head_dx.defined()) return absl::FailedPreconditionError("backward before the loss");
    RETURN_IF_ERROR(hooks.Before(Phase::kBackward, h));
    d = std::move(mb->head_dx);
    RETURN_IF_ERROR(hooks.After(Phase::kBackward, h, nullptr, 0));
  } else {
    if (dy == nullptr) return absl::InvalidArgumentError("backward of a part without the head needs dy");
    d = F32(N, C);
    std::memcpy(d.data<float>(), dy, static_cast<size_t>(N * C) * sizeof(float));
  }
  if (mb->acts.size() != blocks) return absl::FailedPreconditionError("backward before its forward (or run twice)");
  std::vector<const float*> w;
  std::vector<float*> g;
  for (int u = last_block; u >= first_block; --u) {
    RETURN_IF_ERROR(hooks.Before(Phase::kBackward, u));
    w.clear();
    g.clear();
    for (int p : unit_params_[u - part_.first]) {
      w.push_back(hooks.Weight(p));
      g.push_back(hooks.Grad(p));
    }
    UnitStatePtr st = std::move(mb->acts[u - first_block]);
    if (mode == BackwardMode::kInputOnly) {
      ASSIGN_OR_RETURN(UnitStatePtr deferred,
                       m.BlockBackwardInput(ctx, u - 1, w, g, std::move(st), d.data<float>(), d.data<float>()));
      mb->deferred.push_back(std::move(deferred));
    } else {
      RETURN_IF_ERROR(m.BlockBackward(ctx, u - 1, w, g, std::move(st), d.data<float>(), d.data<float>()));
    }
    RETURN_IF_ERROR(hooks.After(Phase::kBackward, u, nullptr, 0));
  }
  mb->acts.clear();
  if (part_.has_embed()) {
    RETURN_IF_ERROR(hooks.Before(Phase::kBackward, 0));
    g.clear();
    for (int p : unit_params_[0]) g.push_back(hooks.Grad(p));
    m.EmbedBackward(ctx, g, mb->tokens, mb->B, mb->T, d.data<float>());
    return hooks.After(Phase::kBackward, 0, nullptr, 0);
  }
  if (dx == nullptr) return absl::InvalidArgumentError("backward of a part without the embedding needs dx");
  std::memcpy(dx, d.data<float>(), static_cast<size_t>(N * C) * sizeof(float));
  return absl::OkStatus();
}

absl::Status Driver::BackwardWeight(const ExecContext& ctx, UnitHooks& hooks, MicroBatch* mb) const {
  const Model& m = *model_;
  const int first_block = std::max(part_.first, 1), last_block = std::min(part_.last, m.NumBlocks());
  const size_t blocks = static_cast<size_t>(std::max(0, last_block - first_block + 1));
  if (mb->deferred.size() != blocks)
    return absl::FailedPreconditionError("weight gradients before the input gradients (or run twice)");
  std::vector<float*> g;
  for (size_t j = 0; j < mb->deferred.size(); ++j) {  // last block first, as BackwardInput ran
    const int u = last_block - static_cast<int>(j);
    RETURN_IF_ERROR(hooks.Before(Phase::kBackwardWeight, u));
    g.clear();
    for (int p : unit_params_[u - part_.first]) g.push_back(hooks.Grad(p));
    RETURN_IF_ERROR(m.BlockBackwardWeight(ctx, u - 1, g, std::move(mb->deferred[j])));
    RETURN_IF_ERROR(hooks.After(Phase::kBackwardWeight, u, nullptr, 0));
  }
  mb->deferred.clear();
  return absl::OkStatus();
}

}  // namespace ember::model
