#include "runtime/model/from_spec.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/glob.h"
#include "runtime/base/status_macros.h"
#include "runtime/jobspec/enums.h"
#include "runtime/model/registry.h"

namespace ember::model {

absl::StatusOr<GptConfig> ConfigFromSpec(const spec::JobSpec& s) {
  const auto& m = s.model();
  GptConfig c;
  c.vocab_size = m.vocab_size();
  c.context = m.context_length();
  c.n_layer = m.n_layers();
  c.n_head = m.n_heads();
  c.d_model = m.d_model();
  ASSIGN_OR_RETURN(const spec::Mlp mlp, spec::ParseMlp("model.mlp", m.mlp()));
  ASSIGN_OR_RETURN(const spec::Arch arch, spec::ParseArch("model.arch", m.arch()));
  c.mlp = mlp == spec::Mlp::kSwiGlu ? GptConfig::Mlp::kSwiGlu
          : mlp == spec::Mlp::kMoe  ? GptConfig::Mlp::kMoe
                                    : GptConfig::Mlp::kGelu;
  c.d_ff = m.mlp_hidden();
  if (mlp == spec::Mlp::kMoe) {
    c.n_expert = m.moe_experts();
    c.top_k = m.moe_top_k();
  }
  c.window = m.attention_window();
  c.init_std = m.init_std();
  c.norm_eps = m.norm_eps();
  c.arch = arch == spec::Arch::kLlama ? GptConfig::Arch::kLlama : GptConfig::Arch::kGpt;
  c.n_kv_head = m.n_kv_heads();
  c.rope_theta = m.rope_theta();
  c.tie_embeddings = m.tie_embeddings();
  if (m.rope_scaling().type() == "llama3") {
    c.rope_scaling.llama3 = true;
    c.rope_scaling.factor = m.rope_scaling().factor();
    c.rope_scaling.low_freq_factor = m.rope_scaling().low_freq_factor();
    c.rope_scaling.high_freq_factor = m.rope_scaling().high_freq_factor();
    c.rope_scaling.original_max_position = m.rope_scaling().original_max_position();
  }
  c.loss.label_smoothing = s.loss().label_smoothing();
  c.loss.z_loss = s.loss().z_loss();
  c.loss.ignore_index = s.loss().ignore_index();
  if (absl::Status st = c.Validate(); !st.ok()) return base::Annotate(st, "model");
  return c;
}

absl::Status CheckModel(const spec::JobSpec& s) {
  if (spec::IsScriptJob(s)) return absl::OkStatus();
  std::vector<ParamSpec> params;
  if (spec::IsBuiltinArch(s.model().arch())) {
    ASSIGN_OR_RETURN(const GptConfig c, ConfigFromSpec(s));
    params = ParamSpecs(c);
  } else {
    // A registered architecture: this build must have it, and its factory checks its fields.
    absl::StatusOr<std::shared_ptr<const Model>> m = MakeModel(s);
    if (absl::IsNotFound(m.status())) return absl::InvalidArgumentError(m.status().message());
    if (!m.ok()) return m.status();
    params = (*m)->ParamSpecs();
  }
  const auto& ov = s.precision().overrides();
  if (ov.empty()) return absl::OkStatus();
  for (int i = 0; i < ov.size(); ++i) {
    bool any = false;
    for (const auto& ps : params) any = any || base::GlobMatch(ov[i].pattern(), ps.name);
    if (!any) {
      return absl::InvalidArgumentError(absl::StrCat(
          "precision.overrides[", i, "].pattern: '", ov[i].pattern(), "' matches no parameter; names look like ",
          params.front().name, ", blocks.0.ln1.weight, ln_f.weight (docs/model.md)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ember::model

namespace ember::spec {

absl::StatusOr<JobSpec> Resolve(const JobSpec& spec, const Facts& facts) {
  ASSIGN_OR_RETURN(JobSpec r, ResolveFields(spec, facts));
  RETURN_IF_ERROR(model::CheckModel(r));
  return r;
}

}  // namespace ember::spec
