// The main job end to end with the real ember-worker: examples/tiny-gpt.yaml (shortened to 20
// steps, checkpoint every 10) on two daemons x 2 CPU slots -> SUCCEEDED, falling loss, logs, a
// committed checkpoint, no worker left. The same for examples/tiny-llama.yaml (arch llama).
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "checkpoint/checkpoint.h"
#include "runtime/daemon/process.h"
#include "testing/cluster.h"
#include "yaml-cpp/yaml.h"

namespace ember::e2e {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void TrainsToSucceeded(const std::string& yaml, const std::string& name, int nodes) {
  auto cluster = TestCluster::Start({.nodes = 2, .slots = 2,
                                     .worker = fs::absolute("runtime/worker/ember-worker")});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  for (int i = 0; i < 250; ++i) {
    auto n = c->Nodes();
    if (n.ok() && n->size() == 2) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  YAML::Node spec = YAML::LoadFile(yaml);
  spec["steps"] = 20;
  spec["checkpoint"]["every_steps"] = 10;
  spec["log_every"] = 1;
  YAML::Emitter out;
  out << spec;
  auto r = c->Submit(out.c_str(), name,
                     {{"data/tiny_corpus.txt", ReadAll("examples/data/tiny_corpus.txt")}});
  REQUIRE(r.ok());
  double first_loss = 0, last_loss = 0;
  auto s = c->StreamMetrics(r->job().id(), true, 100, [&](const jobs::v1::MetricsUpdate& u) {
    auto it = u.ranks().find(0);
    if (it != u.ranks().end() && it->second.metrics().step() > 0) {
      if (first_loss == 0) first_loss = it->second.metrics().loss();
      last_loss = it->second.metrics().loss();
    }
    return true;
  });
  REQUIRE(s.ok());
  auto done = c->Wait(r->job().id(), absl::Seconds(120));
  REQUIRE(done.ok());
  INFO(done->reason());
  for (const auto& l : done->root_cause().last_log_lines()) INFO(l);
  REQUIRE(done->state() == jobs::v1::SUCCEEDED);
  REQUIRE(done->attempts(0).assignment().nodes_size() == nodes);
  REQUIRE(last_loss < first_loss);
  auto steps = ckpt::ListSteps(done->job_dir() + "/checkpoints");
  REQUIRE(!steps.empty());
  REQUIRE(steps.back() == 20);
  int lines = 0;
  REQUIRE(c->StreamLogs(done->id(), -1, false, 0,
                        [&](const jobs::v1::LogLine&) { return ++lines > 0; }).ok());
  REQUIRE(lines > 4);
  REQUIRE(daemon::FindJobProcesses(done->id()).empty());
}

TEST_CASE("examples/tiny-gpt.yaml trains to SUCCEEDED on two daemons with the real worker") {
  TrainsToSucceeded("examples/tiny-gpt.yaml", "tiny-gpt-e2e", 2);  // 4 ranks
}

TEST_CASE("examples/tiny-llama.yaml (arch llama) trains to SUCCEEDED on two daemons") {
  TrainsToSucceeded("examples/tiny-llama.yaml", "tiny-llama-e2e", 1);  // 2 ranks
}

}  // namespace
}  // namespace ember::e2e
