#include "runtime/model/gpt_cuda_plan.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace ember::model {
namespace {

// Hands out aligned slots of an arena that grows as they are taken.
class Arena {
 public:
  int64_t Take(int64_t words) {
    const int64_t at = total_;
    total_ += (words + kGptCudaAlignFloats - 1) / kGptCudaAlignFloats * kGptCudaAlignFloats;
    return at;
  }
  int64_t total() const { return total_; }

 private:
  int64_t total_ = 0;
};

}  // namespace

GptCudaParamLayout PlanGptCudaParams(const GptConfig& cfg) {
  GptCudaParamLayout l;
  Arena a;
  for (const ParamSpec& s : ParamSpecs(cfg)) {
    l.numel.push_back(s.numel());
    l.offset.push_back(a.Take(s.numel()));
    l.host_offset.push_back(l.host_total);
    l.host_total += s.numel();
  }
  l.total = a.total();
  return l;
}

absl::StatusOr<GptCudaActLayout> PlanGptCudaActivations(const GptConfig& cfg, int64_t B,
                                                        int64_t T) {
  RETURN_IF_ERROR(cfg.Validate());
  if (B < 1 || T < 1 || T > cfg.context) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptCuda: batch ", B, "x", T, " needs B, T >= 1 and T <= context ", cfg.context));
  }
  const int64_t N = B * T, C = cfg.d_model, Q = cfg.qkv_width(), F = cfg.ff();
  const int64_t F1 = cfg.mlp == GptConfig::Mlp::kSwiGlu ? 2 * F : F;
  GptCudaActLayout l;
  l.B = B;
  l.T = T;
  Arena a;
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    GptCudaLayerActs s;
    s.x = a.Take(N * C);
    s.ln1 = a.Take(N * C);
    s.rstd1 = a.Take(N);
    s.qkv = a.Take(N * Q);
    s.att = a.Take(N * C);
    s.lse = a.Take(B * cfg.n_head * T);
    s.xmid = a.Take(N * C);
    s.ln2 = a.Take(N * C);
    s.rstd2 = a.Take(N);
    s.fc1 = a.Take(N * F1);
    s.act = a.Take(N * F);
    l.layers.push_back(s);
  }
  l.xf = a.Take(N * C);
  l.lnf = a.Take(N * C);
  l.rstdf = a.Take(N);
  l.dlnf = a.Take(N * C);
  l.dx = a.Take(N * C);
  l.dln = a.Take(N * C);
  l.tmp = a.Take(N * C);
  l.datt = a.Take(N * C);
  l.dact = a.Take(N * F);
  l.dfc1 = a.Take(N * F1);
  l.dqkv = a.Take(N * Q);
  l.tokens = a.Take(N);
  l.targets = a.Take(N);
  l.pos = a.Take(N);
  l.total = a.total();
  return l;
}

}  // namespace ember::model
