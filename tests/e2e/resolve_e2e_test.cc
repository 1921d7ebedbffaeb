// The spec resolved once, through the real daemon (in-process, stand-in worker) and the real
// worker's Prepare (issue 32 item 8):
//   - Submit refuses every entry of the support matrix and the model's checks, naming the field;
//   - <job>/job.yaml is the resolved spec (the job record's spec, and spec::Resolve's result);
//   - the generated matrix (testing/spec_matrix.h): every spec Resolve accepts passes Prepare on
//     every rank without being re-defaulted, every refused one names the field and is refused by
//     a rank given it unresolved too.
#include <fstream>
#include <map>
#include <cmath>
#include <regex>
#include <thread>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "google/protobuf/util/message_differencer.h"
#include "runtime/jobspec/resolve.h"
#include "runtime/jobspec/spec.h"
#include "runtime/model/from_spec.h"
#include "runtime/worker/trainer.h"
#include "runtime/worker/train_state.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/data/token_file.h"
#include "testing/cluster.h"
#include "testing/harness.h"
#include "testing/spec_matrix.h"

namespace ember::e2e {
namespace {

namespace v1 = jobs::v1;
using google::protobuf::util::MessageDifferencer;
using recovery::WaitFor;

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const char kModel[] = "model: {n_layers: 2, d_model: 64, n_heads: 2, context_length: 16}\nsteps: 2\n";

// A spec per support-matrix entry that triggers it (and only it).
const std::map<std::string, std::string> kTriggers = {
    {"pipeline+grad_clip", "parallelism: {strategy: pipeline, pipeline_stages: 2, world_size: 2}\noptimizer: {grad_clip: 1.0}\n"},
    {"pipeline+precision", "parallelism: {strategy: pipeline, pipeline_stages: 2, world_size: 2}\nprecision: {param_dtype: bf16}\n"},
    {"pipeline+init_from_safetensors",
     "parallelism: {strategy: pipeline, pipeline_stages: 2, world_size: 2}\ncheckpoint: {init_from_safetensors: w.st}\n"},
    {"pipeline+init_from",
     "parallelism: {strategy: pipeline, pipeline_stages: 2, world_size: 2}\ncheckpoint: {init_from: hf}\n"
     "model: {arch: llama, n_layers: 2, d_model: 64, n_heads: 2, context_length: 16}\n"},
    {"pipeline+publish", "parallelism: {strategy: pipeline, pipeline_stages: 2, world_size: 2}\npublish: {every_steps: 5}\n"},
    {"hsdp", "parallelism: {dp_replicate: 2, world_size: 4}\n"},
    {"pipeline+hsdp", "parallelism: {strategy: pipeline, pipeline_stages: 2, dp_replicate: 2, world_size: 4}\n"},
    {"cuda+ranks", "resources: {device_type: cuda}\nparallelism: {world_size: 2}\n"},
    {"cuda+hsdp", "resources: {device_type: cuda}\nparallelism: {dp_replicate: 2, world_size: 4}\n"},
    {"cuda+pipeline", "resources: {device_type: cuda}\nparallelism: {strategy: pipeline, pipeline_stages: 2, world_size: 2}\n"},
    {"cuda+grad_accumulation", "resources: {device_type: cuda}\nparallelism: {micro_batches: 2, world_size: 1}\n"},
    {"cuda+precision", "resources: {device_type: cuda}\nparallelism: {world_size: 1}\nprecision: {param_dtype: bf16}\n"},
    {"cuda+publish", "resources: {device_type: cuda}\nparallelism: {world_size: 1}\npublish: {every_steps: 5}\n"},
    {"cuda+registered_arch", "resources: {device_type: cuda}\nparallelism: {world_size: 1}\nmodel: {arch: toy}\n"},
    {"cuda+moe",
     "resources: {device_type: cuda}\nparallelism: {world_size: 1}\n"
     "model: {mlp: moe, n_layers: 2, d_model: 64, n_heads: 2, context_length: 16}\n"},
    {"cuda+head_size",
     "resources: {device_type: cuda}\nparallelism: {world_size: 1}\nmodel: {n_layers: 2, d_model: 64, n_heads: 4, context_length: 16}\n"},
};

// The trigger with the common model unless it brings its own (a YAML key may appear once).
std::string TriggerSpec(const std::string& name, const std::string& extra) {
  const std::string model = absl::StrContains(extra, "model:") ? "steps: 2\n" : kModel;
  return absl::StrCat("name: ", name, "\n", model, extra);
}

TEST_CASE("Submit refuses every entry of the support matrix and the model's checks, naming the field") {
  auto cluster = TestCluster::Start({.nodes = 1, .slots = 4, .cuda = 2});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  REQUIRE(WaitFor([&] { auto n = c->Nodes(); return n.ok() && n->size() == 1; }, absl::Seconds(5)));
  int refused = 0;
  std::vector<std::string> accepted_ids;
  for (const spec::SupportRule& rule : spec::SupportMatrix()) {
    INFO(rule.name);
    auto it = kTriggers.find(rule.name);
    REQUIRE(it != kTriggers.end());  // a new entry needs its trigger here
    std::string name = absl::StrCat("m-", rule.name);
    for (char& ch : name) ch = (ch == '+') ? '-' : ch;
    auto r = c->Submit(TriggerSpec(name, it->second), "", {});
    INFO((r.ok() ? std::string("accepted") : r.status().ToString()));
    if (rule.supported) {  // accepted; cancelled at once (it would run on the stand-in worker)
      REQUIRE(r.ok());
      accepted_ids.push_back(r->job().id());
      REQUIRE(c->Cancel(r->job().id()).ok());
      continue;
    }
    CHECK(absl::IsInvalidArgument(r.status()));
    CHECK(absl::StartsWith(r.status().message(), absl::StrCat(rule.field, ": ")));
    ++refused;
  }
  CHECK(refused > 0);
  // The model's own checks (runtime/model/from_spec.h): an override pattern matching no parameter.
  auto ov = c->Submit(TriggerSpec("m-override", "parallelism: {world_size: 1}\nprecision: {param_dtype: bf16, "
                                                "overrides: [{pattern: \"*norm*\", param_dtype: f32}]}\n"),
                      "", {});
  CHECK(absl::IsInvalidArgument(ov.status()));
  CHECK(absl::StartsWith(ov.status().message(), "precision.overrides[0].pattern: '*norm*' matches no parameter"));
  // World vs layout, with the world taken from the inventory (4 cpu slots): 4 % 3 != 0.
  auto pp3 = c->Submit("name: m-pp3\nmodel: {n_layers: 3, d_model: 64, n_heads: 2, context_length: 16}\n"
                       "parallelism: {strategy: pipeline, pipeline_stages: 3}\nsteps: 2\n", "", {});
  CHECK(absl::StartsWith(pp3.status().message(), "parallelism.pipeline_stages: "));
  // Nothing else was queued; the supported entries' jobs end (cancelled) before the cluster does.
  auto list = c->List();
  REQUIRE(list.ok());
  CHECK(list->size() == accepted_ids.size());
  for (const std::string& id : accepted_ids) {
    CHECK(WaitFor([&] {
      auto j = c->Get(id);
      return j.ok() && (j->state() == v1::CANCELLED || j->state() == v1::SUCCEEDED || j->state() == v1::FAILED);
    }, absl::Seconds(20)));
  }
}

TEST_CASE("job.yaml in the job directory is the resolved spec") {
  auto cluster = TestCluster::Start({.nodes = 1, .slots = 2});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  REQUIRE(WaitFor([&] { auto n = c->Nodes(); return n.ok() && n->size() == 1; }, absl::Seconds(5)));
  // World left open: the inventory's 2 cpu devices; backend, dims and defaults filled in.
  const std::string yaml = "name: resolved-yaml\nmodel: {n_layers: 2, d_model: 32, n_heads: 2, context_length: 16}\n"
                           "optimizer: {lr: 0.002}\nsteps: 2\n";
  auto r = c->Submit(yaml, "", {});
  REQUIRE(r.ok());
  const v1::Job& job = r->job();
  CHECK(job.world_size() == 2);
  CHECK(job.spec().resolved().version() == spec::kResolvedVersion);
  REQUIRE(WaitFor([&] { auto j = c->Get(job.id()); return j.ok() && j->state() == v1::SUCCEEDED; },
                  absl::Seconds(20)));
  const std::string text = Slurp(job.job_dir() + "/job.yaml");
  REQUIRE_FALSE(text.empty());
  CHECK(text != yaml);
  bool here = true;
  auto on_disk = spec::ParseWorkerSpec(text, {}, &here);
  REQUIRE(on_disk.ok());
  CHECK_FALSE(here);  // it carries the marker
  CHECK(MessageDifferencer::Equals(*on_disk, job.spec()));
  // And it is what Resolve makes of the submitted text with the daemon's facts.
  auto parsed = spec::ParseJobSpec(yaml);
  REQUIRE(parsed.ok());
  auto want = spec::Resolve(*parsed, spec::Facts{.devices = {{"cpu", 2}}});
  REQUIRE(want.ok());
  CHECK(MessageDifferencer::Equals(*on_disk, *want));
  CHECK(on_disk->parallelism().world_size() == 2);
  CHECK(on_disk->parallelism().backend() == "cpu");
  CHECK(on_disk->resolved().layout() == "pp=1,dp_replicate=1,dp_shard=2,virtual_stages=1,world=2");
  CHECK(on_disk->optimizer().lr() == 0.002f);
}

// Accepted today, by an independent reading of docs/job-spec.md's support matrix for the CPU
// worker: everything in the matrix but a pipeline that publishes weights (pp x HSDP is not among
// its layouts). Update with the matrix.
// Every combination of the matrix is supported since pipeline jobs publish (publisher.cc); a
// future refusal in it lands in the else branch below, which checks its words.
bool ExpectAccepted(const MatrixSpec&) { return true; }

TEST_CASE("generated matrix: what Resolve accepts passes Prepare on every rank; refusals name the field") {
  const char* t = getenv("TEST_TMPDIR");
  const std::string root = absl::StrCat(t ? t : "/tmp", "/spec-matrix");
  REQUIRE(system(("mkdir -p " + root).c_str()) == 0);
  std::string corpus;
  while (corpus.size() < 20000) corpus += "the quick brown fox jumps over the lazy dog. ";
  const std::regex field_path("^[a-z_0-9]+(\\.[a-z_0-9]+|\\[[0-9]+\\])*: .+");
  int accepted = 0, refused = 0, trained = 0;
  const std::vector<MatrixSpec> matrix = SpecMatrix({.with_publish = true});
  REQUIRE(matrix.size() == 2 * 3 * 2 * 6 * 2 * 2);
  for (const MatrixSpec& m : matrix) {
    INFO(m.name);
    const std::string dir = absl::StrCat(root, "/", m.name);
    REQUIRE(system(("mkdir -p " + dir).c_str()) == 0);
    std::ofstream(dir + "/corpus.txt") << corpus;
    auto parsed = spec::ParseJobSpec(m.yaml);
    REQUIRE(parsed.ok());  // every spec of the matrix is valid; only support varies
    auto resolved = spec::Resolve(*parsed, spec::Facts{});
    CHECK(resolved.ok() == ExpectAccepted(m));
    if (resolved.ok()) {
      ++accepted;
      std::ofstream(dir + "/job.yaml") << spec::ResolvedYaml(*resolved);
      for (int rank = 0; rank < m.world; ++rank) {
        job::WorkerEnv env;
        env.rank = env.local_rank = rank;
        env.world_size = env.local_world_size = m.world;
        env.job_dir = env.upload_dir = dir;
        auto plan = worker::Prepare(env, "");
        INFO("rank " << rank << ": " << plan.status());
        REQUIRE(plan.ok());
        CHECK(MessageDifferencer::Equals(plan->spec, *resolved));  // as resolved, not re-defaulted
      }
      // Every accepted spec trains: 3 steps on every rank (ranks as threads over a file
      // rendezvous; the worker's own groups, TrainState and loader). Publishing needs a job's
      // store, so the publishing variants stop at Prepare.
      if (!absl::StrContains(m.name, "-pub")) {
        ++trained;
        std::vector<std::string> errors(m.world);
        std::vector<std::vector<double>> losses(m.world);
        std::vector<std::thread> ranks;
        const std::string rdzv_dir = absl::StrCat(dir, "/rdzv");
        for (int rank = 0; rank < m.world; ++rank) {
          ranks.emplace_back([&, rank] {
            job::WorkerEnv env;
            env.rank = env.local_rank = rank;
            env.world_size = env.local_world_size = m.world;
            env.job_dir = env.upload_dir = dir;
            errors[rank] = [&]() -> std::string {
              auto plan = worker::Prepare(env, "");
              if (!plan.ok()) return plan.status().ToString();
              auto groups = worker::CreateGroups(*plan, comm::MakeFileRendezvous(rdzv_dir), nullptr);
              if (!groups.ok()) return groups.status().ToString();
              auto state = worker::MakeTrainState(*plan, *groups);
              if (!state.ok()) return state.status().ToString();
              data::TokenLoader loader(plan->tokens, worker::LoaderFor(*plan));
              kernels::ThreadPool pool(1);
              const kernels::ExecContext ctx{&pool, true};
              for (int step = 1; step <= 3; ++step) {
                auto r = (*state)->Step(ctx, loader, step, worker::LearningRate(plan->spec, step));
                if (!r.ok()) return r.status().ToString();
                losses[rank].push_back(r->loss());
              }
              return "";
            }();
          });
        }
        for (auto& t : ranks) t.join();
        for (int rank = 0; rank < m.world; ++rank) {
          INFO("rank " << rank);
          REQUIRE(errors[rank] == "");
          REQUIRE(losses[rank].size() == 3);
          for (double l : losses[rank]) CHECK(std::isfinite(l));
          CHECK(losses[rank] == losses[0]);  // the mean over every rank, the same everywhere
        }
      }
    } else {
      ++refused;
      const std::string msg(resolved.status().message());
      INFO(msg);
      CHECK(absl::IsInvalidArgument(resolved.status()));
      CHECK(std::regex_match(msg, field_path));
      // A rank given the same spec unresolved refuses it too, with the same words.
      std::ofstream(dir + "/job.yaml") << m.yaml;
      job::WorkerEnv env;
      env.world_size = env.local_world_size = m.world;
      env.job_dir = env.upload_dir = dir;
      auto plan = worker::Prepare(env, "");
      REQUIRE_FALSE(plan.ok());
      CHECK(absl::StrContains(plan.status().message(), msg));
    }
  }
  CHECK(accepted == 6 * 48);  // per arch x mlp: 6 layouts x 2 dtypes x 2 clip x 2 publish
  CHECK(refused == 0);
  CHECK(trained == 6 * 24);   // per arch x mlp: 6 layouts x 2 dtypes x 2 clip, without publishing
}

}  // namespace
}  // namespace ember::e2e
