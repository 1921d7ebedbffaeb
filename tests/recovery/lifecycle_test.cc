// A worker's life under signals, with the real ember-worker under in-process daemons:
//   * SIGUSR1 dumps the flight recorder and the rank keeps training (it used to kill the rank);
//   * an absolute data path under a --data-root is accepted and read; others are refused at
//     submit naming the roots (the spec parser used to refuse every absolute path);
//   * a worker the kernel's OOM killer kills (in a memory-limited cgroup v1 this test makes) is
//     reported as "out of memory", not as "signal 9".
// Every test bounds its waits and ends with no worker process left (/proc scan).
#include <signal.h>
#include <unistd.h>

#include <cstring>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "catch2/catch.hpp"
#include "runtime/daemon/process.h"
#include "testing/cluster.h"
#include "testing/harness.h"

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
    step_at_signal = j.ok() ? j->progress().metrics().step() : 0;
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
    return j.ok() && j->progress().metrics().step() >= step_at_signal + 5;
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
  REQUIRE(done->progress().metrics().step() == 6);
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

// A memory cgroup (v1) under this process's own, limited to `bytes`, or "" when this machine has
// no writable v1 memory controller (then the OOM test cannot run here: it says so).
std::string MakeMemoryCgroup(int64_t bytes) {
  std::ifstream f("/proc/self/cgroup");
  std::string line, own;
  while (std::getline(f, line)) {
    const size_t at = line.find(":memory:");
    if (at != std::string::npos) own = line.substr(at + strlen(":memory:"));
  }
  if (own.empty()) return "";
  const std::string dir = absl::StrCat("/sys/fs/cgroup/memory", own == "/" ? "" : own,
                                       "/ember-oom-test-", getpid());
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return "";
  std::ofstream(dir + "/memory.limit_in_bytes") << bytes;
  std::ofstream(dir + "/memory.memsw.limit_in_bytes") << bytes;  // no swapping out of it
  std::ifstream check(dir + "/memory.limit_in_bytes");
  int64_t got = 0;
  check >> got;
  return got == bytes ? dir : "";
}

TEST_CASE("a worker killed by the OOM killer is reported as out of memory") {
  struct RemoveAtEnd {  // after the cluster (declared first): its processes are gone by then
    std::string dir;
    ~RemoveAtEnd() {
      for (int i = 0; i < 100 && !dir.empty() && ::rmdir(dir.c_str()) != 0; ++i) {
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
  } remove;
  const std::string cg = remove.dir = MakeMemoryCgroup(64 << 20);
  if (cg.empty()) {
    WARN("no writable cgroup v1 memory controller here: the OOM report is not tested");
    return;
  }
  // The daemon runs this wrapper as its worker: it joins the limited cgroup, then is ember-worker.
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string wrapper = absl::StrCat(tmp ? tmp : "/tmp", "/oom-worker-", getpid(), ".sh");
  std::ofstream(wrapper) << "#!/bin/sh\necho $$ > " << cg << "/cgroup.procs || exit 3\nexec "
                         << fs::absolute("runtime/worker/ember-worker").string() << " \"$@\"\n";
  fs::permissions(wrapper, fs::perms::owner_all);
  e2e::ClusterOptions o;
  o.nodes = 1;
  o.slots = 1;
  o.worker = wrapper;
  auto cluster = e2e::TestCluster::Start(o);
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  // ~13 M parameters: weights, gradients and AdamW state alone need ~200 MB, past the 64 MiB.
  const std::string spec = absl::StrReplaceAll(
      TinySpec("life-oom", 1, 20, 100),
      {{"n_layers: 1, n_heads: 2, d_model: 32", "n_layers: 4, n_heads: 8, d_model: 512"}});
  auto r = c->Submit(spec, "", {{"data/tiny_corpus.txt", Corpus()}});
  REQUIRE(r.ok());
  auto done = c->Wait(r->job().id(), absl::Seconds(60));
  REQUIRE(done.ok());
  INFO(done->reason());
  REQUIRE(done->state() == v1::FAILED);
  REQUIRE(done->root_cause().signal() == SIGKILL);
  REQUIRE(done->root_cause().oom_killed());
  REQUIRE(absl::StrContains(done->reason(), "rank 0 on node-a ran out of memory"));
  REQUIRE(absl::StrContains(done->reason(), "OOM killer"));
  REQUIRE(WaitFor([&] { return FindJobProcesses(r->job().id()).empty(); }, absl::Seconds(10)));
}

}  // namespace
}  // namespace ember::recovery
