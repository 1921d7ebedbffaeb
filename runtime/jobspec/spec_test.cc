#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "runtime/jobspec/resolve.h"
#include "runtime/jobspec/spec.h"
#include "runtime/jobspec/yaml_proto.h"

namespace ember::spec {
namespace {

const char* kGood = R"(
name: tiny-gpt
model: {n_layers: 2, d_model: 64, n_heads: 4, context_length: 64, mlp: swiglu}
optimizer: {lr: 0.003, schedule: cosine, warmup_steps: 10}
parallelism: {strategy: fsdp, world_size: 4}
precision:
  param_dtype: bf16
  overrides:
    - {pattern: "*norm*", param_dtype: f32}
steps: 50
seed: 7
)";

TEST_CASE("a good YAML spec parses with defaults applied") {
  auto s = ParseJobSpec(kGood);
  REQUIRE(s.ok());
  REQUIRE(s->model().n_layers() == 2);
  REQUIRE(s->model().vocab_size() == 256);
  REQUIRE(s->optimizer().beta2() == Approx(0.95f));
  REQUIRE(s->precision().overrides(0).param_dtype() == "f32");
  REQUIRE(s->precision().output_dtype() == "bf16");
  REQUIRE(Summarize(*s).find("tiny-gpt") == 0);
}

TEST_CASE("JSON is accepted too") {
  auto s = ParseJobSpec(R"({"name": "j", "steps": 3, "model": {"n_layers": 1}})");
  REQUIRE(s.ok());
  REQUIRE(s->steps() == 3);
}

TEST_CASE("errors name the field and the allowed values") {
  auto s = ParseJobSpec("model: {mlp: relu}");
  REQUIRE(absl::IsInvalidArgument(s.status()));
  REQUIRE(s.status().message() == "model.mlp: 'relu' is not allowed; use one of gelu, swiglu, moe");
  s = ParseJobSpec("model: {nlayers: 3}");
  REQUIRE(s.status().message().find("model.nlayers: unknown field; allowed here: vocab_size") == 0);
  s = ParseJobSpec("steps: many");
  REQUIRE(s.status().message().find("steps: 'many' is not a valid") == 0);
  s = ParseJobSpec("model: {d_model: 30, n_heads: 4}");
  REQUIRE(s.status().message().find("not divisible") != std::string::npos);
  s = ParseJobSpec("data: {path: ../etc/passwd}");
  REQUIRE(s.status().message().find("data.path") == 0);
  // Absolute data paths parse; the daemon admits them only under a data root (spec_policy.h).
  REQUIRE(ParseJobSpec("data: {path: /datasets/tokens.bin}").ok());
  s = ParseJobSpec("checkpoint: {dir: ../../x}");
  REQUIRE(s.status().message().find("checkpoint.dir") == 0);
  s = ParseJobSpec("precision: {overrides: [{pattern: x, param_dtype: f8}]}");
  REQUIRE(s.status().message().find("precision.overrides[0].param_dtype") == 0);
  s = ParseJobSpec("model: [1, 2]");
  REQUIRE(s.status().message().find("model: expected a mapping") == 0);
  REQUIRE(ParseJobSpec("publish: {every_steps: 5}").ok());
  s = ParseJobSpec("publish: {every_steps: -1}");
  REQUIRE(s.status().message().find("publish.every_steps") == 0);
  REQUIRE(ParseJobSpec("publish: {every_steps: 5, wait_for_subscribers: 2, wait_timeout_s: 30}").ok());
  s = ParseJobSpec("publish: {wait_for_subscribers: 1}");
  REQUIRE(s.status().message().find("publish.wait_for_subscribers") == 0);
  s = ParseJobSpec("publish: {every_steps: 5, wait_for_subscribers: -1}");
  REQUIRE(s.status().message().find("publish.wait_for_subscribers") == 0);
  s = ParseJobSpec("model: {n_layers: 2}\nparallelism: {strategy: pipeline, pipeline_stages: 2}\n"
                   "publish: {every_steps: 5}");
  REQUIRE(s.ok());  // valid; what the worker cannot run yet is the support matrix (Resolve)
  s = ResolveFields(*s, Facts{.world_size = 2});
  REQUIRE(s.ok());  // pipeline jobs publish too (publisher.cc: every stage's tensors in one manifest)
  REQUIRE(ParseJobSpec("model: {n_layers: 2}\nparallelism: {strategy: pipeline, pipeline_stages: 2}").ok());
  // fault_tolerance: replicas memory defaults to every step; every_steps alone or < 1 is refused.
  s = ParseJobSpec("fault_tolerance: {replicas: memory}");
  REQUIRE(s.ok());
  REQUIRE(s->fault_tolerance().every_steps() == 1);
  REQUIRE(ParseJobSpec("fault_tolerance: {replicas: memory, every_steps: 10}")->fault_tolerance().every_steps() == 10);
  REQUIRE(!ParseJobSpec("name: x")->fault_tolerance().has_every_steps());
  s = ParseJobSpec("fault_tolerance: {replicas: disk}");
  REQUIRE(s.status().message().find("fault_tolerance.replicas: 'disk' is not allowed") == 0);
  s = ParseJobSpec("fault_tolerance: {replicas: memory, every_steps: 0}");
  REQUIRE(s.status().message().find("fault_tolerance.every_steps: 0 is out of range") == 0);
  s = ParseJobSpec("fault_tolerance: {every_steps: 2}");
  REQUIRE(s.status().message().find("fault_tolerance.every_steps: applies to replicas: memory only") == 0);
  s = ParseJobSpec("{unclosed");
  REQUIRE(absl::IsInvalidArgument(s.status()));
}

TEST_CASE("non-finite floats, an empty spec, an explicit 0 and duplicate keys are refused") {
  for (const char* t : {"optimizer: {lr: .nan}", "optimizer: {lr: .inf}", "optimizer: {lr: -.inf}",
                        "optimizer: {beta1: .NaN}", "optimizer: {min_lr_ratio: .nan}",
                        "model: {init_std: .inf}", "model: {norm_eps: .nan}",
                        "loss: {z_loss: .inf}"}) {
    auto s = ParseJobSpec(t);
    INFO(t << " -> " << s.status());
    REQUIRE(absl::IsInvalidArgument(s.status()));
    REQUIRE(s.status().message().find("is not a finite number") != std::string::npos);
  }
  REQUIRE(absl::IsInvalidArgument(ParseJobSpec("optimizer: {grad_clip: 1e39}").status()));
  for (const char* t : {"", "# only a comment\n", "{}", "\n\n"}) {
    auto s = ParseJobSpec(t);
    INFO("'" << t << "' -> " << s.status());
    REQUIRE(absl::IsInvalidArgument(s.status()));
    REQUIRE(s.status().message().find("spec: empty") == 0);
  }
  // An explicit 0 is validated, not replaced by the default (steps: 0 used to run 100 steps).
  auto s = ParseJobSpec("name: j\nsteps: 0\n");
  REQUIRE(s.status().message() == "steps: 0 is out of range; allowed 1 to 1e+12");
  s = ParseJobSpec("name: j\nbatch_size: 0\n");
  REQUIRE(s.status().message().find("batch_size: 0 is out of range") == 0);
  s = ParseJobSpec("model: {n_layers: 0}");
  REQUIRE(s.status().message().find("model.n_layers: 0 is out of range") == 0);
  // ... and where 0 is a legal value it is kept (cosine down to 0; no momentum).
  s = ParseJobSpec("optimizer: {min_lr_ratio: 0, beta1: 0}");
  REQUIRE(s.ok());
  REQUIRE(s->optimizer().min_lr_ratio() == 0.0f);
  REQUIRE(s->optimizer().beta1() == 0.0f);
  REQUIRE(ParseJobSpec("name: j")->steps() == 100);
  // Duplicate keys name the key and the line, at every level and in JSON.
  s = ParseJobSpec("name: j\nsteps: 3\nsteps: 5\n");
  REQUIRE(s.status().message() == "steps: duplicate key on line 3; each field may appear once");
  s = ParseJobSpec("name: j\nmodel:\n  n_layers: 1\n  d_model: 64\n  n_layers: 2\n");
  REQUIRE(s.status().message().find("model.n_layers: duplicate key on line 5") == 0);
  s = ParseJobSpec(R"({"name": "j", "optimizer": {"lr": 0.1, "lr": 0.2}})");
  REQUIRE(s.status().message().find("optimizer.lr: duplicate key on line 1") == 0);
}

TEST_CASE("job names: [A-Za-z0-9][A-Za-z0-9._-]{0,62}") {
  for (const char* ok : {"a", "tiny-gpt", "Run_2.b", "0", "a-"}) {
    INFO(ok);
    REQUIRE(ValidateJobName(ok).ok());
    REQUIRE(ParseJobSpec(std::string("name: \"") + ok + "\"").ok());
  }
  REQUIRE(ValidateJobName(std::string(63, 'x')).ok());
  for (const std::string& bad : std::vector<std::string>{".", "..", "-x", "--help", "_a", ".hidden", "a b", "a/b", "a\nb",
                                "a\rb", "\xc3\xa9", std::string(64, 'x')}) {
    INFO(bad);
    REQUIRE(absl::IsInvalidArgument(ValidateJobName(bad)));
  }
  // Through the parser: the message names the field and never carries the raw newline.
  auto s = ParseJobSpec("name: \"x\\n[info] job forged\"");
  REQUIRE(absl::IsInvalidArgument(s.status()));
  REQUIRE(s.status().message().find("name: 'x\\n[info] job forged' is not a job name") == 0);
  REQUIRE(s.status().message().find('\n') == std::string::npos);
  REQUIRE(ParseJobSpec("name: \"..\"").status().message().find("name: '..'") == 0);
  REQUIRE(ParseJobSpec("name: -x").status().message().find("name: '-x'") == 0);
}

TEST_CASE("model.arch llama: defaults, and errors naming the field and value") {
  auto g = ParseJobSpec("model: {n_heads: 4}");
  REQUIRE(g.ok());
  CHECK(g->model().arch() == "gpt");
  CHECK(g->model().mlp() == "gelu");
  CHECK(g->model().n_kv_heads() == 4);
  CHECK(g->model().tie_embeddings());
  auto l = ParseJobSpec("model: {arch: llama, n_heads: 8, n_kv_heads: 2}");
  REQUIRE(l.ok());
  CHECK(l->model().mlp() == "swiglu");
  CHECK(l->model().n_kv_heads() == 2);
  CHECK(l->model().rope_theta() == 10000.0f);
  CHECK_FALSE(l->model().tie_embeddings());
  CHECK(l->model().rope_scaling().type().empty());
  auto r = ParseJobSpec("model: {arch: llama, rope_theta: 500000, rope_scaling: {type: llama3, factor: 32}}");
  REQUIRE(r.ok());
  CHECK(r->model().rope_scaling().factor() == 32.0f);
  CHECK(r->model().rope_scaling().low_freq_factor() == 1.0f);
  CHECK(r->model().rope_scaling().high_freq_factor() == 4.0f);
  CHECK(r->model().rope_scaling().original_max_position() == 8192);
  REQUIRE(ParseJobSpec("model: {arch: llama, mlp: moe, attention_window: 16, tie_embeddings: true}").ok());
  auto msg = [](const char* t) { return std::string(ParseJobSpec(t).status().message()); };
  CHECK(ParseJobSpec("model: {arch: mamba}").ok());  // well-formed: spec::Resolve asks the registry
  CHECK(msg("model: {arch: ../x}").find("model.arch: '../x' is not an architecture name") == 0);
  CHECK(msg("model: {arch: llama, n_heads: 4, n_kv_heads: 3}") ==
        "model.n_kv_heads: 3 does not divide model.n_heads=4");
  CHECK(msg("model: {arch: llama, n_heads: 4, n_kv_heads: 8}").find("model.n_kv_heads: 8 is out of range") == 0);
  CHECK(msg("model: {n_heads: 4, n_kv_heads: 2}").find("model.n_kv_heads: 2 != n_heads needs model.arch: llama") == 0);
  CHECK(msg("model: {tie_embeddings: false}").find("model.tie_embeddings: false needs model.arch: llama") == 0);
  CHECK(msg("model: {arch: llama, rope_scaling: {type: yarn}}").find("model.rope_scaling.type: 'yarn'") == 0);
  CHECK(msg("model: {arch: llama, rope_theta: 0.5}").find("model.rope_theta: 0.5 is out of range") == 0);
  CHECK(msg("model: {arch: llama, rope_scaling: {type: llama3, low_freq_factor: 4, high_freq_factor: 2}}")
            .find("model.rope_scaling.high_freq_factor: 2 is out of range") == 0);
  CHECK(msg("model: {arch: llama, d_model: 12, n_heads: 4}").find("model.d_model: head width") == 0);
}

TEST_CASE("loss and norm settings: defaults, ranges") {
  auto s = ParseJobSpec("name: j");
  REQUIRE(s->model().norm_eps() == 1e-5f);
  REQUIRE(s->loss().ignore_index() == -100);
  REQUIRE(s->loss().label_smoothing() == 0.0f);
  REQUIRE(s->loss().z_loss() == 0.0f);
  s = ParseJobSpec("model: {norm_eps: 1e-6}\nloss: {label_smoothing: 0.1, z_loss: 1e-4, ignore_index: 0}");
  REQUIRE(s.ok());
  REQUIRE(s->model().norm_eps() == 1e-6f);
  REQUIRE(s->loss().ignore_index() == 0);  // 0 is a token id, not "unset"
  REQUIRE(s->loss().label_smoothing() == 0.1f);
  REQUIRE(ParseJobSpec("loss: {label_smoothing: 1}").status().message().find("loss.label_smoothing") == 0);
  REQUIRE(ParseJobSpec("loss: {z_loss: -1}").status().message().find("loss.z_loss") == 0);
  REQUIRE(ParseJobSpec("model: {norm_eps: 0}").status().message().find("model.norm_eps") == 0);
  REQUIRE(ParseJobSpec("loss: {ignore_index: 256}").status().message().find(
              "loss.ignore_index: 256 can never match") == 0);
}

TEST_CASE("a fuzzed corpus never crashes and never yields an invalid spec") {
  std::mt19937 rng(1234);
  std::string base = kGood;
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string t = base;
    int edits = 1 + rng() % 4;
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % t.size();
      switch (rng() % 3) {
        case 0: t[pos] = static_cast<char>(rng() % 128); break;
        case 1: t.erase(pos, 1 + rng() % 8); break;
        default: t.insert(pos, std::string(1 + rng() % 3, "{}[]:,-'\"#\n 9x"[rng() % 15])); break;
      }
      if (t.empty()) t = "x";
    }
    auto s = ParseJobSpec(t);
    if (s.ok()) {
      ++accepted;
      REQUIRE(ValidateJobSpec(*s).ok());
    } else {
      REQUIRE(absl::IsInvalidArgument(s.status()));
      REQUIRE_FALSE(s.status().message().empty());
    }
  }
  WARN("fuzzed specs accepted: " << accepted << " of 3000");
}

// The generic YAML -> proto (emberd's config uses it too): fields set, others untouched; the
// document's name in errors about the document; single values from text (flags).
TEST_CASE("ParseYamlInto and SetFieldFromText work on any message") {
  JobSpec s;
  s.set_steps(7);
  REQUIRE(ParseYamlInto("name: x\nmodel: {n_layers: 3}\n", &s, "doc").ok());
  CHECK(s.name() == "x");
  CHECK(s.model().n_layers() == 3);
  CHECK(s.steps() == 7);
  REQUIRE(ParseYamlInto("", &s, "doc").ok());
  auto bad = ParseYamlInto("[1, 2]", &s, "doc");
  CHECK(absl::StartsWith(bad.message(), "doc: expected a mapping"));
  bad = ParseYamlInto("{unclosed", &s, "doc");
  CHECK(absl::StartsWith(bad.message(), "doc is not valid YAML/JSON"));
  bad = ParseYamlInto("model: {n_layerz: 1}", &s, "doc");
  CHECK(absl::StartsWith(bad.message(), "model.n_layerz: unknown field; allowed here: vocab_size"));
  const auto* steps = JobSpec::descriptor()->FindFieldByName("steps");
  REQUIRE(SetFieldFromText("12", steps, &s, "--steps").ok());
  CHECK(s.steps() == 12);
  bad = SetFieldFromText("many", steps, &s, "--steps");
  CHECK(bad.message() == "--steps: 'many' is not a valid int64");
  CHECK(s.steps() == 12);
  const auto* model = JobSpec::descriptor()->FindFieldByName("model");
  CHECK(absl::IsInvalidArgument(SetFieldFromText("1", model, &s, "--model")));
}


TEST_CASE("a script job: worker.script, args, env map, default interpreter") {
  auto s = ParseJobSpec(
      "name: ddp\nworker: {script: train.py, args: ['--lr', '0.1'], env: {NCCL_DEBUG: INFO, "
      "OMP_NUM_THREADS: '2'}}\nparallelism: {world_size: 4}\nmax_restarts: 2\n");
  REQUIRE(s.ok());
  CHECK(IsScriptJob(*s));
  CHECK(s->worker().python() == "/usr/bin/python3");
  REQUIRE(s->worker().args_size() == 2);
  CHECK(s->worker().args(1) == "0.1");
  CHECK(s->worker().env().at("NCCL_DEBUG") == "INFO");
  CHECK(s->worker().env().at("OMP_NUM_THREADS") == "2");
  CHECK(Summarize(*s) == "ddp: /usr/bin/python3 train.py on 4 cpu ranks");
  auto bad = [](const std::string& yaml) {
    auto r = ParseJobSpec(yaml);
    REQUIRE_FALSE(r.ok());
    return std::string(r.status().message());
  };
  CHECK(bad("worker: {script: ../x.py}").find("worker.script") != std::string::npos);
  CHECK(bad("worker: {script: x.py, python: python3}").find("worker.python") != std::string::npos);
  CHECK(bad("worker: {script: x.py, env: {1BAD: x}}").find("worker.env.1BAD") != std::string::npos);
  CHECK(bad("worker: {script: x.py, env: {A: x, A: y}}").find("duplicate") != std::string::npos);
  CHECK(bad("worker: {script: x.py, env: [A]}").find("worker.env") != std::string::npos);
  CHECK(bad("worker: {args: [x]}").find("worker.script: is required") != std::string::npos);
  CHECK_FALSE(IsScriptJob(*ParseJobSpec("data: {text_path: x.txt}")));
}
// Issue 31/32: what every rank refused at its start is refused when the spec is resolved (at
// Submit), naming the field.
TEST_CASE("specs no rank can train are refused when resolved, naming the field") {
  const std::string pp = "model: {n_layers: 2}\nparallelism: {strategy: pipeline, pipeline_stages: 2}\n";
  auto field = [](const std::string& y) {
    auto s = ParseJobSpec(y);
    if (s.ok()) s = ResolveFields(*s, Facts{.world_size = 2});
    return s.ok() ? std::string("accepted") : std::string(s.status().message());
  };
  // Supported since issue 32 (the pipeline's stages are FSDP-sharded driver parts).
  CHECK(field(pp + "optimizer: {grad_clip: 1.0}") == "accepted");
  CHECK(field(pp + "precision: {param_dtype: bf16}") == "accepted");
  CHECK(field(pp + "publish: {every_steps: 1}") == "accepted");  // publisher.cc: one manifest over the stages
  CHECK(field(pp + "checkpoint: {init_from_safetensors: w.st}") == "accepted");  // each stage loads its own
  CHECK(absl::StartsWith(field(pp + "checkpoint: {init_from: hf}"), "checkpoint.init_from:"));  // gpt: no HF layout
  CHECK(field("model: {arch: llama, mlp: swiglu, n_layers: 2}\nparallelism: {strategy: pipeline, pipeline_stages: 2}\n"
              "checkpoint: {init_from: hf}") == "accepted");
  CHECK(field(pp) == "accepted");
  CHECK(absl::StartsWith(field("checkpoint: {init_from: hf}"), "checkpoint.init_from:"));  // gpt
  CHECK(field("model: {arch: llama, mlp: swiglu}\ncheckpoint: {init_from: hf}") == "accepted");
  auto pipe = ParseJobSpec(pp);
  REQUIRE(pipe.ok());
  CHECK(CheckWorldSize(*pipe, 4).ok());
  CHECK(absl::StartsWith(CheckWorldSize(*pipe, 3).message(), "parallelism.pipeline_stages:"));
  auto none = ParseJobSpec("parallelism: {strategy: none}");
  REQUIRE(none.ok());
  CHECK(CheckWorldSize(*none, 1).ok());
  CHECK(absl::StartsWith(CheckWorldSize(*none, 2).message(), "parallelism.strategy:"));
  auto fixed = ParseJobSpec("parallelism: {world_size: 2}");
  REQUIRE(fixed.ok());
  CHECK(absl::StartsWith(CheckWorldSize(*fixed, 3).message(), "parallelism.world_size:"));
}

}  // namespace
}  // namespace ember::spec
