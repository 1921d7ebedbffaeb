// A worker's life under signals, with the real ember-worker under in-process daemons:
//   * SIGUSR1 dumps the flight recorder and the rank keeps training (it used to kill the rank);
//   * an absolute data path under a --data-root is accepted and read; others are refused at
//     submit naming the roots (the spec parser used to refuse every absolute path).
// Every test bounds its waits and ends with no worker process left (/proc scan).
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "catch2/catch.hpp"
#include "runtime/daemon/process.h"
#include "tests/e2e/cluster.h"
#include "tests/recovery/harness.h"

namespace ember::recovery {
namespace {

namespace v1 = jobs::v1;
namespace fs = std::filesystem;
using daemon::FindJobProcesses;

TEST_CASE("SIGUSR1 makes a real worker dump its flight recorder and keep training") {
  e2e::ClusterOptions o;
  o.nodes = 1;
  o.slots = 2;
  o.worker = fs::absolute("runtime/worker/ember-worker").string();
  auto cluster = e2e::TestCluster::Start(o);
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  auto r = c->Submit(TinySpec("life-usr1", 2, 100000, 100000), "",
                     {{"data/tiny_corpus.txt", Corpus()}});
  REQUIRE(r.ok());
  const std::string id = r->job().id();
  int64_t step_at_signal = 0;
  REQUIRE(WaitFor([&] {
    auto j = c->Get(id);
    step_at_signal = j.ok() ? j->progress().step() : 0;
    return step_at_signal >= 3;
  }, absl::Seconds(60)));
  const pid_t rank0 = RankPid(id, 0, 0);
  REQUIRE(rank0 > 0);
  const std::string dump = absl::StrCat(r->job().job_dir(), "/flight/attempt-0/rank-0.json");
  REQUIRE_FALSE(fs::exists(dump));
  REQUIRE(kill(rank0, SIGUSR1) == 0);
  REQUIRE(WaitFor([&] { return fs::exists(dump); }, absl::Seconds(10)));
  INFO(ReadFile(dump).substr(0, 400));
  REQUIRE(absl::StrContains(ReadFile(dump), "signal"));
  // Still the same process, still training.
  REQUIRE(WaitFor([&] {
    auto j = c->Get(id);
    return j.ok() && j->progress().step() >= step_at_signal + 5;
  }, absl::Seconds(30)));
  REQUIRE(RankPid(id, 0, 0) == rank0);
  auto j = c->Get(id);
  REQUIRE(j.ok());
  REQUIRE(j->state() == v1::RUNNING);
  REQUIRE(j->attempts_size() == 1);
  REQUIRE(c->Cancel(id).ok());
  REQUIRE(WaitFor([&] { return FindJobProcesses(id).empty(); }, absl::Seconds(10)));
}

TEST_CASE("absolute data paths under a data root are read; others are refused naming the roots") {
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string root = absl::StrCat(tmp ? tmp : "/tmp", "/datasets-", getpid());
  fs::create_directories(root);
  std::ofstream(root + "/tiny.txt") << Corpus();
  e2e::ClusterOptions o;
  o.nodes = 1;
  o.slots = 1;
  o.worker = fs::absolute("runtime/worker/ember-worker").string();
  o.data_roots = {root, "/nonexistent/corpora"};
  auto cluster = e2e::TestCluster::Start(o);
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  const std::string spec = TinySpec("life-root", 1, 6, 100);
  auto r = c->Submit(absl::StrReplaceAll(spec, {{"data/tiny_corpus.txt", root + "/tiny.txt"}}));
  INFO(r.status());
  REQUIRE(r.ok());
  auto done = c->Wait(r->job().id(), absl::Seconds(60));
  REQUIRE(done.ok());
  INFO(done->reason());
  REQUIRE(done->state() == v1::SUCCEEDED);
  REQUIRE(done->progress().step() == 6);
  // Outside every root: refused before anything runs, naming the field and the roots.
  auto bad = c->Submit(absl::StrReplaceAll(spec, {{"data/tiny_corpus.txt", "/etc/hostname"}}));
  INFO(bad.status());
  REQUIRE(absl::IsPermissionDenied(bad.status()));
  REQUIRE(absl::StrContains(bad.status().message(), "data.text_path"));
  REQUIRE(absl::StrContains(bad.status().message(),
                            absl::StrCat("the data roots (", root, ", /nonexistent/corpora)")));
  auto climbs = c->Submit(absl::StrReplaceAll(spec, {{"data/tiny_corpus.txt", root + "/../x"}}));
  REQUIRE(absl::IsInvalidArgument(climbs.status()));
}

}  // namespace
}  // namespace ember::recovery
