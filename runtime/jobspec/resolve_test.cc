// The spec resolved once: facts -> world/backend/dims, the marker, the support matrix (every
// entry exercised by a spec that triggers it), job.yaml's text reading back to the same proto,
// and a worker's reading of a resolved spec applying no defaults.
#include "runtime/jobspec/resolve.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "runtime/jobspec/parallel_dims.h"
#include "runtime/jobspec/yaml_proto.h"

namespace ember::spec {
namespace {

using google::protobuf::util::MessageDifferencer;

const char kModel[] = "model: {n_layers: 4, n_heads: 2, d_model: 64, context_length: 16}\ndata: {text_path: c.txt}\n";

absl::StatusOr<JobSpec> ResolveText(const std::string& yaml, Facts f = {}) {
  auto s = ParseJobSpec(yaml);
  if (!s.ok()) return s.status();
  return ResolveFields(*s, f);
}

std::string Outcome(const std::string& yaml, Facts f = {}) {
  auto r = ResolveText(yaml, f);
  return r.ok() ? std::string("accepted") : std::string(r.status().message());
}

// One spec per support-matrix entry that only that combination makes unrunnable (world 2 unless
// the entry is about ranks). A new entry without a case here fails the test below.
const std::map<std::string, std::pair<std::string, int>> kTriggers = {
    {"pipeline+grad_clip", {"parallelism: {strategy: pipeline, pipeline_stages: 2}\noptimizer: {grad_clip: 1.0}\n", 2}},
    {"pipeline+precision", {"parallelism: {strategy: pipeline, pipeline_stages: 2}\nprecision: {param_dtype: bf16}\n", 2}},
    {"pipeline+init_from_safetensors",
     {"parallelism: {strategy: pipeline, pipeline_stages: 2}\ncheckpoint: {init_from_safetensors: w.st}\n", 2}},
    {"pipeline+init_from",
     {"parallelism: {strategy: pipeline, pipeline_stages: 2}\ncheckpoint: {init_from: hf}\n"
      "model: {arch: llama, n_layers: 4, n_heads: 2, d_model: 64, context_length: 16}\n", 2}},
    {"pipeline+publish", {"parallelism: {strategy: pipeline, pipeline_stages: 2}\npublish: {every_steps: 5}\n", 2}},
    {"hsdp", {"parallelism: {dp_replicate: 2}\n", 4}},
    {"pipeline+hsdp", {"parallelism: {strategy: pipeline, pipeline_stages: 2, dp_replicate: 2}\n", 4}},
    {"cuda+ranks", {"resources: {device_type: cuda}\n", 2}},
    {"cuda+hsdp", {"resources: {device_type: cuda}\nparallelism: {dp_replicate: 2}\n", 4}},
    {"cuda+pipeline", {"resources: {device_type: cuda}\nparallelism: {strategy: pipeline, pipeline_stages: 2}\n", 2}},
    {"cuda+grad_accumulation", {"resources: {device_type: cuda}\nparallelism: {micro_batches: 2}\n", 1}},
    {"cuda+precision", {"resources: {device_type: cuda}\nprecision: {param_dtype: bf16}\n", 1}},
    {"cuda+publish", {"resources: {device_type: cuda}\npublish: {every_steps: 5}\n", 1}},
    {"cuda+registered_arch", {"resources: {device_type: cuda}\nmodel: {arch: toy}\n", 1}},
    {"cuda+moe", {"resources: {device_type: cuda}\nmodel: {mlp: moe, n_layers: 4, n_heads: 2, d_model: 64, context_length: 16}\n", 1}},
    {"cuda+head_size", {"resources: {device_type: cuda}\nmodel: {n_layers: 4, n_heads: 4, d_model: 64, context_length: 16}\n", 1}},
};

// The trigger's YAML with the common model and data, its own `model:` line winning.
std::string TriggerSpec(const std::string& extra) {
  if (absl::StrContains(extra, "model:")) return absl::StrCat("data: {text_path: c.txt}\n", extra);
  return absl::StrCat(kModel, extra);
}

TEST_CASE("support matrix: every entry refuses its combination, naming its field") {
  std::set<std::string> names;
  for (const SupportRule& r : SupportMatrix()) {
    INFO(r.name);
    REQUIRE(names.insert(r.name).second);  // names are unique
    auto it = kTriggers.find(r.name);
    REQUIRE(it != kTriggers.end());
    const auto& [extra, world] = it->second;
    const std::string yaml = TriggerSpec(extra);
    auto parsed = ParseJobSpec(yaml);
    REQUIRE(parsed.ok());  // valid: only the worker cannot run it (yet)
    auto r2 = ResolveFields(*parsed, Facts{.world_size = world});
    if (r.supported) {
      CHECK(r2.ok());
      continue;
    }
    REQUIRE_FALSE(r2.ok());
    CHECK(absl::IsInvalidArgument(r2.status()));
    CHECK(absl::StartsWith(r2.status().message(), absl::StrCat(r.field, ": ")));
  }
  CHECK(names.size() == kTriggers.size());
  // The same layouts without the combination are accepted.
  CHECK(Outcome(absl::StrCat(kModel, "parallelism: {strategy: pipeline, pipeline_stages: 2}\n"), {.world_size = 2}) ==
        "accepted");
  CHECK(Outcome(absl::StrCat(kModel, "resources: {device_type: cuda}\n"), {.world_size = 1}) == "accepted");
  CHECK(Outcome(absl::StrCat(kModel, "optimizer: {grad_clip: 1.0}\nprecision: {param_dtype: bf16}\n"),
                {.world_size = 4}) == "accepted");
  // Script jobs are not ember-worker's: the matrix does not apply.
  CHECK(Outcome("worker: {script: t.py}\nresources: {device_type: cuda}\nparallelism: {world_size: 4}\n") == "accepted");
}

TEST_CASE("resolve: the world, the backend and the dims are filled in; the marker is set") {
  // World from the facts, the spec, devices_per_node x nodes, or the inventory of the job's kind.
  auto r = ResolveText(kModel, {.world_size = 3});
  REQUIRE(r.ok());
  CHECK(r->parallelism().world_size() == 3);
  CHECK(r->resolved().world_size() == 3);
  r = ResolveText(absl::StrCat(kModel, "resources: {devices_per_node: 2, nodes: 3}\n"));
  REQUIRE(r.ok());
  CHECK(r->parallelism().world_size() == 6);
  r = ResolveText(kModel, {.devices = {{"cpu", 5}, {"cuda", 7}}});
  REQUIRE(r.ok());
  CHECK(r->parallelism().world_size() == 5);
  r = ResolveText(kModel);
  REQUIRE(r.ok());
  CHECK(r->parallelism().world_size() == 1);  // an empty inventory: at least one rank
  // The backend follows the device type; a mismatch names both fields.
  CHECK(r->parallelism().backend() == "cpu");
  r = ResolveText(absl::StrCat(kModel, "resources: {device_type: cuda}\n"), {.world_size = 1});
  REQUIRE(r.ok());
  CHECK(r->parallelism().backend() == "nccl");
  const std::string mismatch = Outcome(absl::StrCat(kModel, "parallelism: {backend: nccl}\n"), {.world_size = 1});
  CHECK(absl::StartsWith(mismatch, "parallelism.backend: 'nccl' does not run on resources.device_type 'cpu'"));
  // Dims: pipeline 2 on 8 ranks; the pipeline fields written out.
  r = ResolveText(absl::StrCat(kModel, "parallelism: {strategy: pipeline, pipeline_stages: 2}\n"), {.world_size = 8});
  REQUIRE(r.ok());
  CHECK(r->resolved().version() == kResolvedVersion);
  CHECK(r->resolved().pp() == 2);
  CHECK(r->resolved().dp_replicate() == 1);
  CHECK(r->resolved().dp_shard() == 4);
  CHECK(r->resolved().layout() == "pp=2,dp_replicate=1,dp_shard=4,virtual_stages=1,world=8");
  CHECK(r->parallelism().pipeline_schedule() == "1f1b");
  CHECK(r->parallelism().pipeline_micro_batches() == 2);
  CHECK(r->parallelism().pipeline_virtual_stages() == 1);
  CHECK(r->parallelism().dp_replicate() == 1);
  // 4 replicas x (batch_size 4 x 2 pipeline micro-batches) x 16 tokens.
  CHECK(r->resolved().tokens_per_step() == 4 * 4 * 2 * 16);
  auto dims = ParallelDims::FromResolved(*r);
  REQUIRE(dims.ok());
  CHECK(dims->Layout() == r->resolved().layout());
  CHECK(*dims == *ParallelDims::FromSpec(*r, 8));
  CHECK(absl::StartsWith(ParallelDims::FromResolved(JobSpec()).status().message(), "resolved: "));
  // World refusals name the field.
  CHECK(absl::StartsWith(Outcome(absl::StrCat(kModel, "parallelism: {strategy: pipeline, pipeline_stages: 2}\n"),
                                 {.world_size = 3}),
                         "parallelism.pipeline_stages: "));
  CHECK(absl::StartsWith(Outcome(absl::StrCat(kModel, "parallelism: {world_size: 2}\n"), {.world_size = 3}),
                         "parallelism.world_size: "));
  CHECK(absl::StartsWith(Outcome(absl::StrCat(kModel, "parallelism: {dp_replicate: 3}\n"), {.world_size = 4}),
                         "parallelism.dp_replicate: "));
  // Idempotent, and a user's own `resolved:` section is replaced.
  auto again = ResolveFields(*r, {.world_size = 8});
  REQUIRE(again.ok());
  CHECK(MessageDifferencer::Equals(*again, *r));
  auto forged = ResolveText(absl::StrCat(kModel, "resolved: {version: 1, world_size: 99, layout: x}\n"), {.world_size = 2});
  REQUIRE(forged.ok());
  CHECK(forged->resolved().world_size() == 2);
  CHECK(forged->resolved().layout() == "pp=1,dp_replicate=1,dp_shard=2,virtual_stages=1,world=2");
}

TEST_CASE("resolve: job.yaml reads back to the resolved proto, with no defaults applied again") {
  const std::string yaml = absl::StrCat(
      "name: round\nmodel: {arch: llama, n_layers: 4, n_heads: 4, n_kv_heads: 2, d_model: 64, context_length: 16, "
      "rope_theta: 500000, rope_scaling: {type: llama3, factor: 32}}\n"
      "data: {text_path: c.txt}\noptimizer: {lr: 0.0003, grad_clip: 0.7, schedule: cosine, warmup_steps: 3}\n"
      "precision: {param_dtype: bf16, overrides: [{pattern: \"*ln*\", param_dtype: f32}]}\n"
      "loss: {label_smoothing: 0.1, z_loss: 0.0001}\nseed: 12345678901\ndeterministic: true\n"
      "worker: {}\n");
  auto r = ResolveText(yaml, {.world_size = 2});
  REQUIRE(r.ok());
  const std::string text = ResolvedYaml(*r);
  bool here = true;
  auto back = ParseWorkerSpec(text, {.world_size = 2}, &here);
  REQUIRE(back.ok());
  CHECK_FALSE(here);
  CHECK(MessageDifferencer::Equals(*back, *r));
  CHECK(back->optimizer().lr() == 0.0003f);
  CHECK(back->model().rope_scaling().factor() == 32.0f);
  CHECK(back->seed() == 12345678901);
  // A script job's environment map survives too.
  auto sj = ResolveText("worker: {script: t.py, env: {B: \"2\", A: \"x y\"}, args: [\"--a\", \"b c\"]}\n", {.world_size = 2});
  REQUIRE(sj.ok());
  auto sback = ParseWorkerSpec(ResolvedYaml(*sj), {}, &here);
  REQUIRE(sback.ok());
  CHECK(MessageDifferencer::Equals(*sback, *sj));

  // Strings of any text a spec allows (control characters, quotes, backslashes, non-ASCII, YAML
  // syntax) read back byte for byte; bytes that are not UTF-8 are refused when parsed.
  JobSpec odd = *r;
  const std::string weird[] = {std::string("a\x01" "b\x7f\"q'\\ \xc3\xa9 \xf0\x9f\x94\xa5:#[]{}&*!|>%@`"), "- x", "yes",
                               "~", "null", "0x10", " lead", "trail ", "\ttab\r\nline", "\x1b[31m"};
  for (const std::string& w : weird) odd.mutable_precision()->add_overrides()->set_pattern(w);
  odd.mutable_data()->set_text_path(weird[0]);
  auto odd_back = ParseWorkerSpec(ToYaml(odd), {.world_size = 2}, &here);
  if (odd_back.ok()) {
    MessageDifferencer md;
    std::string diff;
    md.ReportDifferencesToString(&diff);
    CHECK(md.Compare(*odd_back, odd));
    INFO(diff);
    CHECK(diff.empty());
  } else {
    FAIL(odd_back.status().ToString() << "\n" << ToYaml(odd));
  }
  CHECK(ParseJobSpec("data: {text_path: \"a\xff.txt\"}").status().message() ==
        "data.text_path: not valid UTF-8 (byte 1)");
  // No re-defaulting: a resolved spec whose optimizer.lr is unset stays unset (lr 0 is valid),
  // where a spec without the marker gets the default.
  JobSpec no_lr = *r;
  no_lr.mutable_optimizer()->clear_lr();
  auto kept = ParseWorkerSpec(ToYaml(no_lr), {.world_size = 2}, &here);
  REQUIRE(kept.ok());
  CHECK_FALSE(here);
  CHECK_FALSE(kept->optimizer().has_lr());
  JobSpec unmarked = no_lr;
  unmarked.clear_resolved();
  auto defaulted = ParseWorkerSpec(ToYaml(unmarked), {.world_size = 2}, &here);
  REQUIRE(defaulted.ok());
  CHECK(here);  // resolved once, by the worker
  CHECK(defaulted->optimizer().lr() == 1e-3f);
  CHECK(defaulted->resolved().version() == kResolvedVersion);
  // A resolved spec the worker cannot run (edited after Submit) is still refused.
  JobSpec edited = *r;
  edited.mutable_resources()->set_device_type("cuda");  // micro-batches on cuda: the support matrix
  edited.mutable_parallelism()->set_backend("nccl");
  edited.mutable_parallelism()->set_micro_batches(2);
  auto refused = ParseWorkerSpec(ToYaml(edited), {.world_size = 2}, &here);
  CHECK(absl::StrContains(refused.status().message(), "parallelism.micro_batches: "));
  JobSpec future = *r;
  future.mutable_resolved()->set_version(kResolvedVersion + 1);
  CHECK(absl::StartsWith(ParseWorkerSpec(ToYaml(future), {}, &here).status().message(), "resolved.version: "));
  // The world a rank runs in must be the resolved one.
  CHECK(CheckResolvedFor(*r, 2).ok());
  CHECK(absl::StartsWith(CheckResolvedFor(*r, 4).message(), "parallelism.world_size: "));
}

}  // namespace
}  // namespace ember::spec
