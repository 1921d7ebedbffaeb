#include "runtime/daemon/memory_estimate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/jobspec/enums.h"

namespace ember::daemon {
namespace {

std::string GiB(int64_t bytes) { return absl::StrFormat("%.1f GiB", bytes / 1073741824.0); }

}  // namespace

std::string MemoryEstimate::ToString() const {
  return absl::StrFormat(
      "%s per rank (%.3g M parameters: %s of sharded weights, gradients and AdamW state, %s of "
      "gathered layer weights, %s of activations)",
      GiB(per_rank()), params / 1e6, GiB(state_bytes), GiB(gathered_bytes), GiB(activation_bytes));
}

MemoryEstimate EstimateMemory(const spec::v1::JobSpec& spec, int world) {
  const auto& m = spec.model();
  const int64_t d = m.d_model(), L = m.n_layers(), V = m.vocab_size(), T = m.context_length();
  const int64_t heads = m.n_heads();
  int64_t hidden = m.mlp_hidden();
  int64_t mlp_params = 0;
  // The parameters as runtime/model's ParamSpecs lays them out (checked against it in the test).
  const spec::Mlp mlp = spec::MlpOf(spec);
  if (mlp == spec::Mlp::kSwiGlu) {
    if (hidden == 0) hidden = (8 * d / 3 + 15) / 16 * 16;
    mlp_params = 3 * d * hidden;
  } else {
    if (hidden == 0) hidden = 4 * d;
    mlp_params = 2 * d * hidden;
  }
  if (mlp == spec::Mlp::kMoe) mlp_params = mlp_params * m.moe_experts() + d * m.moe_experts();
  // qkv ((H + 2 KV) hd rows), proj, MLP, two norms
  const int64_t kv = m.n_kv_heads() > 0 ? m.n_kv_heads() : heads;
  const int64_t layer = (heads + 2 * kv) * (d / heads) * d + d * d + mlp_params + 2 * d;
  MemoryEstimate e;
  const bool llama = spec::ArchOf(spec) == spec::Arch::kLlama;
  // wte, wpe (gpt), blocks, ln_f, lm_head (untied)
  e.params = V * d + (llama ? 0 : T * d) + L * layer + d + (m.tie_embeddings() || !llama ? 0 : V * d);
  const int64_t w = std::max(1, world);
  e.state_bytes = 16 * ((e.params + w - 1) / w);  // fp32 weights, gradients, m, v
  e.gathered_bytes = 2 * 4 * std::max(layer, V * d);
  // Saved per layer and token: the residual stream, q/k/v and outputs, MLP in and out (a few d
  // and two hidden), plus the attention probabilities (heads x T per token); logits and their
  // gradient once.
  const int64_t B = spec.batch_size();
  const int64_t window = m.attention_window() > 0 ? std::min<int64_t>(m.attention_window(), T) : T;
  const int64_t per_token_layer = 12 * d + 2 * (mlp == spec::Mlp::kMoe ? hidden * m.moe_top_k() : hidden) +
                                  heads * window;
  e.activation_bytes = 4 * B * T * (L * per_token_layer + 2 * V);
  return e;
}

absl::Status CheckMemoryFits(const spec::v1::JobSpec& spec, int world, const std::string& kind,
                             const std::vector<jobs::v1::Node>& nodes) {
  const MemoryEstimate e = EstimateMemory(spec, world);
  if (kind == "cuda") {
    int64_t gpu = 0;
    for (const auto& n : nodes)
      for (const auto& dv : n.devices())
        if (dv.kind() == "cuda" && dv.has_gpu()) gpu = std::max(gpu, dv.gpu().memory_total_bytes());
    if (gpu == 0 || e.per_rank() <= gpu) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "the job needs about ", e.ToString(), " but the largest GPU has ", GiB(gpu),
        "; lower batch_size or the model size, or use more ranks (the state is sharded over "
        "them)"));
  }
  int nodes_of_kind = 0;
  int64_t ram = 0;
  for (const auto& n : nodes) {
    bool has = false;
    for (const auto& dv : n.devices()) has = has || dv.kind() == kind;
    if (!has) continue;
    ++nodes_of_kind;
    ram = std::max(ram, n.memory_total_bytes());
  }
  if (nodes_of_kind == 0 || ram == 0) return absl::OkStatus();  // nothing to compare with
  int per_node = spec.resources().devices_per_node();
  if (per_node <= 0) per_node = (std::max(1, world) + nodes_of_kind - 1) / nodes_of_kind;
  per_node = std::min(per_node, std::max(1, world));
  if (e.per_rank() * per_node <= ram) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the job needs about ", e.ToString(), ", ", GiB(e.per_rank() * per_node), " for the ",
      per_node, " ranks a node runs, but the largest node has ", GiB(ram),
      " of memory; lower batch_size or the model size, or spread the ranks over more nodes"));
}

}  // namespace ember::daemon
