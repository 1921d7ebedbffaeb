#include "runtime/jobspec/spec.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status_macros.h"
#include "runtime/jobspec/enums.h"
#include "runtime/jobspec/parallel_dims.h"
#include "runtime/jobspec/pipeline_layout.h"
#include "runtime/jobspec/yaml_proto.h"
#include "yaml-cpp/yaml.h"

namespace ember::spec {
namespace {

constexpr size_t kMaxSpecBytes = 1 << 20;

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path.empty() ? "spec" : path, ": ", what));
}

absl::Status OneOf(const std::string& path, const std::string& value,
                   const std::vector<std::string>& allowed) {
  for (const auto& a : allowed) {
    if (value == a) return absl::OkStatus();
  }
  return Bad(path, absl::StrCat("'", value, "' is not allowed; use one of ",
                                absl::StrJoin(allowed, ", ")));
}

// Also refuses NaN (every comparison with NaN is false).
absl::Status Range(const std::string& path, double v, double lo, double hi) {
  if (!(v >= lo && v <= hi)) {
    return Bad(path, absl::StrCat(v, " is out of range; allowed ", lo, " to ", hi));
  }
  return absl::OkStatus();
}

bool EnvName(const std::string& n) {
  if (n.empty() || n.size() > 128 || (n[0] >= '0' && n[0] <= '9')) return false;
  for (char ch : n) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '_')) {
      return false;
    }
  }
  return true;
}

// worker: the script job's own fields (which environment names are the daemon's to set, and
// which absolute script paths a data root allows, is the daemon's policy: spec_policy.h).
absl::Status ValidateWorker(const spec::v1::WorkerConfig& w) {
  if (w.script().empty()) {
    if (w.args_size() > 0 || !w.python().empty() || w.env_size() > 0) {
      return Bad("worker.script", "is required when worker.args, worker.python or worker.env is set");
    }
    return absl::OkStatus();
  }
  if (absl::StrContains(w.script(), "..") || absl::EndsWith(w.script(), "/")) {
    return Bad("worker.script", absl::StrCat("'", w.script(), "' must be a file name inside the "
                                             "job's uploads (no \"..\"), or an absolute path "
                                             "under a data root"));
  }
  if (w.python()[0] != '/' || absl::StrContains(w.python(), "..")) {
    return Bad("worker.python", absl::StrCat("'", w.python(), "' must be an absolute path "
                                             "without \"..\" (default ", kDefaultPython, ")"));
  }
  for (int i = 0; i < w.args_size(); ++i) {
    if (w.args(i).find('\0') != std::string::npos) {
      return Bad(absl::StrCat("worker.args[", i, "]"), "contains a NUL byte");
    }
  }
  for (const auto& [k, v] : w.env()) {
    if (!EnvName(k)) {
      return Bad(absl::StrCat("worker.env.", k), "is not an environment name ([A-Za-z_][A-Za-z0-9_]*)");
    }
    if (v.find('\0') != std::string::npos) return Bad(absl::StrCat("worker.env.", k), "contains a NUL byte");
  }
  return absl::OkStatus();
}

// model.arch and the fields only llama uses (n_kv_heads, rope_*, tie_embeddings).
absl::Status ValidateArch(const v1::ModelConfig& m) {
  RETURN_IF_ERROR(CheckArchName("model.arch", m.arch()));
  // A registered architecture checks its own fields (its factory, at spec::Resolve).
  if (!IsBuiltinArch(m.arch())) return absl::OkStatus();
  RETURN_IF_ERROR(Range("model.n_kv_heads", m.n_kv_heads(), 1, m.n_heads()));
  if (m.n_heads() % m.n_kv_heads() != 0) {
    return Bad("model.n_kv_heads", absl::StrCat(m.n_kv_heads(), " does not divide model.n_heads=",
                                                m.n_heads()));
  }
  const auto& r = m.rope_scaling();
  RETURN_IF_ERROR(OneOf("model.rope_scaling.type", r.type(), {"", "llama3"}));
  if (m.arch() == "gpt") {
    const std::string why = " needs model.arch: llama (gpt has learned positions, multi-head "
                            "attention and a tied head)";
    if (m.n_kv_heads() != m.n_heads())
      return Bad("model.n_kv_heads", absl::StrCat(m.n_kv_heads(), " != n_heads", why));
    if (!m.tie_embeddings()) return Bad("model.tie_embeddings", absl::StrCat("false", why));
    if (!r.type().empty()) return Bad("model.rope_scaling.type", absl::StrCat("'", r.type(), "'", why));
    return absl::OkStatus();
  }
  if ((m.d_model() / m.n_heads()) % 2 != 0) {
    return Bad("model.d_model", absl::StrCat("head width d_model/n_heads = ", m.d_model() / m.n_heads(),
                                             " is odd; RoPE rotates pairs of dimensions"));
  }
  RETURN_IF_ERROR(Range("model.rope_theta", m.rope_theta(), 1.0001, 1e12));
  if (r.type() == "llama3") {
    RETURN_IF_ERROR(Range("model.rope_scaling.factor", r.factor(), 1, 1e6));
    RETURN_IF_ERROR(Range("model.rope_scaling.low_freq_factor", r.low_freq_factor(), 1e-6, 1e6));
    RETURN_IF_ERROR(Range("model.rope_scaling.high_freq_factor", r.high_freq_factor(),
                          r.low_freq_factor() * (1 + 1e-6), 1e6));
    RETURN_IF_ERROR(Range("model.rope_scaling.original_max_position", r.original_max_position(), 1, 1 << 24));
  }
  return absl::OkStatus();
}

}  // namespace

// Defaults apply to unset fields only: an explicit value, 0 included, is kept and validated.
void ApplyDefaults(JobSpec* s) {
  if (s->name().empty()) s->set_name("job");
  auto* m = s->mutable_model();
  if (!m->has_vocab_size()) m->set_vocab_size(256);
  if (!m->has_context_length()) m->set_context_length(128);
  if (!m->has_n_layers()) m->set_n_layers(2);
  if (!m->has_n_heads()) m->set_n_heads(4);
  if (!m->has_d_model()) m->set_d_model(128);
  if (m->arch().empty()) m->set_arch("gpt");
  const bool llama = m->arch() == "llama";
  if (m->mlp().empty()) m->set_mlp(llama ? "swiglu" : "gelu");
  if (!m->has_n_kv_heads()) m->set_n_kv_heads(m->n_heads());
  if (!m->has_rope_theta()) m->set_rope_theta(10000.0f);
  if (!m->has_tie_embeddings()) m->set_tie_embeddings(!llama);
  if (m->rope_scaling().type() == "llama3") {
    auto* r = m->mutable_rope_scaling();
    if (r->factor() == 0) r->set_factor(8.0f);
    if (r->low_freq_factor() == 0) r->set_low_freq_factor(1.0f);
    if (r->high_freq_factor() == 0) r->set_high_freq_factor(4.0f);
    if (r->original_max_position() == 0) r->set_original_max_position(8192);
  }
  if (m->mlp() == "moe") {
    if (!m->has_moe_experts()) m->set_moe_experts(4);
    if (!m->has_moe_top_k()) m->set_moe_top_k(2);
  }
  if (!m->has_init_std()) m->set_init_std(0.02f);
  if (!m->has_norm_eps()) m->set_norm_eps(1e-5f);
  auto* l = s->mutable_loss();
  if (!l->has_ignore_index()) l->set_ignore_index(-100);
  auto* d = s->mutable_data();
  if (d->token_dtype().empty()) d->set_token_dtype("uint16");
  auto* o = s->mutable_optimizer();
  if (o->name().empty()) o->set_name("adamw");
  if (!o->has_lr()) o->set_lr(1e-3f);
  if (!o->has_beta1()) o->set_beta1(0.9f);
  if (!o->has_beta2()) o->set_beta2(0.95f);
  if (!o->has_eps()) o->set_eps(1e-8f);
  if (o->schedule().empty()) o->set_schedule("constant");
  if (!o->has_min_lr_ratio()) o->set_min_lr_ratio(0.1f);
  auto* p = s->mutable_parallelism();
  if (p->strategy().empty()) p->set_strategy("fsdp");
  if (!p->has_micro_batches()) p->set_micro_batches(1);
  if (!p->has_reshard_after_forward()) p->set_reshard_after_forward(true);
  if (!p->has_prefetch()) p->set_prefetch(true);
  if (!p->has_separate_reduce_scatter()) p->set_separate_reduce_scatter(true);
  auto* pr = s->mutable_precision();
  if (pr->param_dtype().empty()) pr->set_param_dtype("f32");
  if (pr->output_dtype().empty()) pr->set_output_dtype(pr->param_dtype());
  auto* c = s->mutable_checkpoint();
  if (!c->has_keep_last()) c->set_keep_last(3);
  auto* r = s->mutable_resources();
  if (r->device_type().empty()) r->set_device_type("cpu");
  if (!s->has_steps()) s->set_steps(100);
  if (!s->has_batch_size()) s->set_batch_size(4);
  if (!s->has_log_every()) s->set_log_every(1);
  if (!s->has_collective_timeout_s()) s->set_collective_timeout_s(600);
  auto* ft = s->mutable_fault_tolerance();
  if (ReplicaModeOf(*s) == ReplicaMode::kMemory && !ft->has_every_steps()) ft->set_every_steps(1);
  if (!s->worker().script().empty() && s->worker().python().empty()) {
    s->mutable_worker()->set_python(std::string(kDefaultPython));
  }
}

absl::Status ValidateJobName(const std::string& name) {
  auto ascii_alnum = [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
  };
  bool ok = !name.empty() && name.size() <= kMaxJobNameBytes && ascii_alnum(name[0]);
  for (char ch : name) ok = ok && (ascii_alnum(ch) || ch == '.' || ch == '_' || ch == '-');
  if (ok) return absl::OkStatus();
  return Bad("name", absl::StrCat("'", absl::CHexEscape(name.substr(0, 80)),
                                  name.size() > 80 ? "...'" : "'",
                                  " is not a job name: 1-63 characters of [A-Za-z0-9._-] starting "
                                  "with a letter or digit"));
}

absl::Status ValidateJobSpec(const JobSpec& s) {
  const auto& m = s.model();
  RETURN_IF_ERROR(Range("model.vocab_size", m.vocab_size(), 2, 1 << 20));
  RETURN_IF_ERROR(Range("model.context_length", m.context_length(), 1, 1 << 20));
  RETURN_IF_ERROR(Range("model.n_layers", m.n_layers(), 1, 1024));
  RETURN_IF_ERROR(Range("model.n_heads", m.n_heads(), 1, 1024));
  RETURN_IF_ERROR(Range("model.d_model", m.d_model(), 1, 1 << 16));
  if (m.d_model() % m.n_heads() != 0) {
    return Bad("model.d_model", absl::StrCat(m.d_model(), " is not divisible by model.n_heads=",
                                             m.n_heads()));
  }
  RETURN_IF_ERROR(ParseMlp("model.mlp", m.mlp()).status());
  RETURN_IF_ERROR(Range("model.mlp_hidden", m.mlp_hidden(), 0, 1 << 20));
  RETURN_IF_ERROR(Range("model.attention_window", m.attention_window(), 0, 1 << 20));
  if (m.mlp() == "moe") {
    RETURN_IF_ERROR(Range("model.moe_experts", m.moe_experts(), 1, 1024));
    RETURN_IF_ERROR(Range("model.moe_top_k", m.moe_top_k(), 1, m.moe_experts()));
  }
  RETURN_IF_ERROR(Range("model.init_std", m.init_std(), 1e-6, 10));
  RETURN_IF_ERROR(Range("model.norm_eps", m.norm_eps(), 1e-12, 1));
  RETURN_IF_ERROR(ValidateArch(m));
  const auto& l = s.loss();
  RETURN_IF_ERROR(Range("loss.label_smoothing", l.label_smoothing(), 0, 0.999));
  RETURN_IF_ERROR(Range("loss.z_loss", l.z_loss(), 0, 10));
  if (l.ignore_index() >= m.vocab_size() || l.ignore_index() < INT32_MIN) {
    return Bad("loss.ignore_index",
               absl::StrCat(l.ignore_index(), " can never match a target token (model.vocab_size ",
                            m.vocab_size(), "); use a token id below vocab_size to skip it, or a "
                            "negative value (default -100) to skip none"));
  }
  const auto& d = s.data();
  RETURN_IF_ERROR(OneOf("data.token_dtype", d.token_dtype(), {"uint16", "uint32"}));
  // Absolute data paths are allowed here: the daemon accepts them only under an operator's data
  // root (emberd --data-root, runtime/daemon/spec_policy.h), a worker reads them as given.
  for (const auto* p : {&d.path(), &d.text_path()}) {
    if (absl::StrContains(*p, "..")) {
      return Bad(p == &d.path() ? "data.path" : "data.text_path",
                 absl::StrCat("'", *p, "' must not contain \"..\" (a path inside the job "
                              "directory, or an absolute path under a data root)"));
    }
  }
  RETURN_IF_ERROR(Range("data.start_position", static_cast<double>(d.start_position()), 0, 1e15));
  RETURN_IF_ERROR(OneOf("data.tokenizer.kind", d.tokenizer().kind(), {"", "bytes", "sentencepiece"}));
  if (const std::string& h = d.tokenizer().sha256(); !h.empty()) {
    if (d.tokenizer().kind() != "sentencepiece") {
      return Bad("data.tokenizer.sha256", "only with kind: sentencepiece (the hash of its .model file)");
    }
    if (h.size() != 64 || h.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return Bad("data.tokenizer.sha256", absl::StrCat("'", h, "' is not 64 lowercase hex digits (sha256sum of the .model file)"));
    }
  }
  if (d.tokenizer().kind() == "sentencepiece" && d.path().empty()) {
    return Bad("data.tokenizer.kind", "sentencepiece needs data.path (a make-tokens file); data.text_path is read as bytes");
  }
  const auto& o = s.optimizer();
  RETURN_IF_ERROR(OneOf("optimizer.name", o.name(), {"adamw"}));
  RETURN_IF_ERROR(Range("optimizer.lr", o.lr(), 0, 10));
  RETURN_IF_ERROR(Range("optimizer.beta1", o.beta1(), 0, 0.999999));
  RETURN_IF_ERROR(Range("optimizer.beta2", o.beta2(), 0, 0.999999));
  RETURN_IF_ERROR(Range("optimizer.eps", o.eps(), 0, 1));
  RETURN_IF_ERROR(Range("optimizer.weight_decay", o.weight_decay(), 0, 10));
  RETURN_IF_ERROR(Range("optimizer.grad_clip", o.grad_clip(), 0, 1e6));
  RETURN_IF_ERROR(OneOf("optimizer.schedule", o.schedule(), {"constant", "cosine"}));
  RETURN_IF_ERROR(Range("optimizer.warmup_steps", o.warmup_steps(), 0, 1e9));
  RETURN_IF_ERROR(Range("optimizer.min_lr_ratio", o.min_lr_ratio(), 0, 1));
  const auto& p = s.parallelism();
  RETURN_IF_ERROR(OneOf("parallelism.strategy", p.strategy(), {"fsdp", "pipeline", "none"}));
  RETURN_IF_ERROR(Range("parallelism.world_size", p.world_size(), 0, 1 << 16));
  RETURN_IF_ERROR(Range("parallelism.micro_batches", p.micro_batches(), 1, 1 << 16));
  RETURN_IF_ERROR(ValidatePipelineLayout(s));  // pipeline_layout.h
  RETURN_IF_ERROR(Range("parallelism.dp_replicate", p.dp_replicate(), 0, 1 << 16));
  if (p.dp_replicate() > 1 && p.strategy() == "none") {
    return Bad("parallelism.dp_replicate", absl::StrCat(p.dp_replicate(), " replicas with strategy 'none' (one rank); "
                                                        "use strategy fsdp (HSDP) or leave dp_replicate 0"));
  }
  if (const int64_t pr = int64_t{PipelineLayoutOf(s).ranks} * std::max(1, p.dp_replicate());
      p.world_size() != 0 && p.world_size() % pr != 0) {
    return Bad("parallelism.dp_replicate",
               absl::StrCat(p.world_size(), " ranks (world_size) is not pipeline_stages x dp_replicate (", pr,
                            ") x a shard size; use a dp_replicate that divides world_size / pipeline_stages"));
  }
  if (!p.backend().empty()) {
    RETURN_IF_ERROR(ParseBackend("parallelism.backend", p.backend()).status());
  }
  const auto& pr = s.precision();
  RETURN_IF_ERROR(ParseDtype("precision.param_dtype", pr.param_dtype()).status());
  RETURN_IF_ERROR(ParseDtype("precision.output_dtype", pr.output_dtype()).status());
  if (!pr.reduce_dtype().empty()) {
    RETURN_IF_ERROR(ParseDtype("precision.reduce_dtype", pr.reduce_dtype()).status());
  }
  for (int i = 0; i < pr.overrides_size(); ++i) {
    const auto& ov = pr.overrides(i);
    std::string base = absl::StrCat("precision.overrides[", i, "]");
    if (ov.pattern().empty()) return Bad(base + ".pattern", "must not be empty");
    if (!ov.param_dtype().empty()) RETURN_IF_ERROR(ParseDtype(base + ".param_dtype", ov.param_dtype()).status());
    if (!ov.reduce_dtype().empty()) RETURN_IF_ERROR(ParseDtype(base + ".reduce_dtype", ov.reduce_dtype()).status());
  }
  const auto& c = s.checkpoint();
  if (absl::StartsWith(c.dir(), "/") || absl::StrContains(c.dir(), "..")) {
    return Bad("checkpoint.dir", absl::StrCat("'", c.dir(), "' must be a relative path inside the job directory"));
  }
  if (absl::StartsWith(c.init_from_safetensors(), "/") ||
      absl::StrContains(c.init_from_safetensors(), "..")) {
    return Bad("checkpoint.init_from_safetensors", "must be a relative path inside the job directory");
  }
  // Like data.path: absolute only under an operator's data root (the daemon checks), never "..".
  if (absl::StrContains(c.init_from(), "..")) {
    return Bad("checkpoint.init_from", absl::StrCat("'", c.init_from(), "' must not contain \"..\" (a directory inside "
                                                    "the job directory, or an absolute path under a data root)"));
  }
  if (!c.init_from().empty() && !c.init_from_safetensors().empty()) {
    return Bad("checkpoint.init_from", "set either init_from (a Hugging Face directory) or init_from_safetensors, not both");
  }
  RETURN_IF_ERROR(Range("checkpoint.every_steps", c.every_steps(), 0, 1e9));
  RETURN_IF_ERROR(Range("publish.every_steps", s.publish().every_steps(), 0, 1e9));
  RETURN_IF_ERROR(Range("publish.wait_for_subscribers", s.publish().wait_for_subscribers(), 0, 1024));
  RETURN_IF_ERROR(Range("publish.wait_timeout_s", s.publish().wait_timeout_s(), 0, 86400));
  if (s.publish().wait_for_subscribers() > 0 && s.publish().every_steps() <= 0) {
    return Bad("publish.wait_for_subscribers",
               absl::StrCat(s.publish().wait_for_subscribers(), " needs publish.every_steps > 0 (publishing is off): "
                            "set every_steps or remove wait_for_subscribers"));
  }
  RETURN_IF_ERROR(Range("checkpoint.keep_last", c.keep_last(), 1, 1000));
  const auto& ft = s.fault_tolerance();
  ASSIGN_OR_RETURN(const ReplicaMode replicas, ParseReplicaMode("fault_tolerance.replicas", ft.replicas()));
  if (ft.has_every_steps() && replicas != ReplicaMode::kMemory) {
    return Bad("fault_tolerance.every_steps", "applies to replicas: memory only; set fault_tolerance.replicas: memory or drop every_steps");
  }
  if (replicas == ReplicaMode::kMemory) RETURN_IF_ERROR(Range("fault_tolerance.every_steps", ft.every_steps(), 1, 1e9));
  // What ember-worker cannot train (yet) is the support matrix: resolve.h CheckSupported.
  if (!c.init_from().empty() && (m.arch() != "llama" || m.mlp() != "swiglu")) {
    return Bad("checkpoint.init_from", absl::StrCat(
        "'", c.init_from(), "' is read as a Hugging Face Llama directory; the job's model must be "
        "model.arch: llama with model.mlp: swiglu (it is arch '", m.arch(), "', mlp '", m.mlp(), "')"));
  }
  const auto& r = s.resources();
  RETURN_IF_ERROR(OneOf("resources.device_type", r.device_type(), {"cpu", "cuda"}));
  RETURN_IF_ERROR(Range("resources.nodes", r.nodes(), 0, 1 << 16));
  RETURN_IF_ERROR(Range("resources.devices_per_node", r.devices_per_node(), 0, 1024));
  RETURN_IF_ERROR(Range("steps", static_cast<double>(s.steps()), 1, 1e12));
  RETURN_IF_ERROR(Range("batch_size", s.batch_size(), 1, 1 << 20));
  RETURN_IF_ERROR(Range("threads", s.threads(), 0, 1024));
  RETURN_IF_ERROR(Range("log_every", s.log_every(), 1, 1 << 30));
  RETURN_IF_ERROR(Range("max_restarts", s.max_restarts(), 0, 1000));
  RETURN_IF_ERROR(Range("collective_timeout_s", s.collective_timeout_s(), 1, 86400));
  RETURN_IF_ERROR(ValidateWorker(s.worker()));
  return ValidateJobName(s.name());
}

absl::Status CheckWorldSize(const JobSpec& s, int world) {
  const auto& par = s.parallelism();
  // pipeline_stages x dp_replicate must divide the world (ParallelDims names the field).
  RETURN_IF_ERROR(ParallelDims::FromSpec(s, world).status());
  if (par.strategy() == "none" && world != 1) {
    return Bad("parallelism.strategy", absl::StrCat("'none' needs one rank, the job has ", world));
  }
  if (par.world_size() != 0 && par.world_size() != world) {
    return Bad("parallelism.world_size", absl::StrCat(par.world_size(), " does not match the ", world,
                                                      " ranks the job runs on"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& text) { return ParseJobSpec(text, 0); }

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& text, int world_size) {
  if (text.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec is ", text.size(), " bytes; the limit is ", kMaxSpecBytes));
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("spec is not valid YAML/JSON: ", e.what()));
  }
  if (root.IsNull() || (root.IsMap() && root.size() == 0)) {
    return absl::InvalidArgumentError(
        "spec: empty; a job needs at least data.path or data.text_path (docs/job-spec.md)");
  }
  JobSpec spec;
  RETURN_IF_ERROR(FillFromYaml(root, &spec, "spec"));
  if (world_size > 0) spec.mutable_parallelism()->set_world_size(world_size);
  ApplyDefaults(&spec);
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open job spec '", path, "'"));
  std::stringstream ss;
  ss << f.rdbuf();
  auto spec = ParseJobSpec(ss.str());
  if (!spec.ok()) return base::Annotate(spec.status(), path);
  return spec;
}

std::string Summarize(const JobSpec& s) {
  if (IsScriptJob(s)) {
    return absl::StrCat(s.name(), ": ", s.worker().python(), " ", s.worker().script(), " on ",
                        s.parallelism().world_size() ? absl::StrCat(s.parallelism().world_size())
                                                     : std::string("all placed"),
                        " ", s.resources().device_type(), " ranks");
  }
  // On cuda, fsdp over several ranks trains data parallel with the model replicated on every GPU
  // (runtime/worker/cuda_trainer.h): say so rather than promise sharding.
  const bool replicated = s.resources().device_type() == "cuda" && s.parallelism().strategy() == "fsdp" &&
                          s.parallelism().world_size() != 1;
  return absl::StrCat(s.name(), ": ", s.model().n_layers(), " layers x ", s.model().d_model(),
                      " (", s.model().mlp(), "), ", s.parallelism().strategy(),
                      replicated ? " (on cuda: data parallel, replicated)" : "", " on ",
                      s.parallelism().world_size() ? absl::StrCat(s.parallelism().world_size())
                                                   : std::string("all placed"),
                      " ", s.resources().device_type(), " ranks, ", s.steps(), " steps, ",
                      s.precision().param_dtype(), " params");
}

}  // namespace ember::spec
