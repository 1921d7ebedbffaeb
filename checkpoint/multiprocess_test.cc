// Real processes, real store: a rank killed with SIGKILL in the middle of a save leaves the previous
// checkpoint as `latest` and loadable, and no half checkpoint visible.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/test_util.h"
#include "runtime/store/server.h"

namespace ember::ckpt {
namespace {

std::string RankBinary() { return std::string(getenv("TEST_SRCDIR")) + "/ember/checkpoint/ckpt_rank"; }

pid_t Spawn(const std::vector<std::string>& args) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Exit code, or -signal; kills the child (and returns -9) if it outlives `timeout`.
int WaitFor(pid_t pid, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -999;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

bool WaitForFile(const std::string& path, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (!PathExists(path)) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

struct Cluster {
  std::string addr, root;
  std::vector<pid_t> Start(const std::string& prefix, int world, int64_t step, int slow_rank,
                           int timeout_s) {
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
      pids.push_back(Spawn({RankBinary(), "--store=" + addr, "--prefix=" + prefix, "--root=" + root,
                            absl::StrCat("--rank=", r), absl::StrCat("--world=", world),
                            absl::StrCat("--step=", step),
                            absl::StrCat("--delay_ms=", r == slow_rank ? 300 : 0),
                            absl::StrCat("--timeout_s=", timeout_s), "--log-level=warn"}));
    }
    return pids;
  }
};

void CheckStep1IsLatestAndGood(const std::string& root) {
  CHECK(*ResolveLatest(root) == root + "/step-1");
  CHECK_FALSE(PathExists(root + "/step-2"));
  CHECK(ListSteps(root) == std::vector<int64_t>{1});
  auto r = CheckpointReader::Open(root);
  REQUIRE(r.ok());
  CHECK((*r)->metadata().step == 1);
  CHECK((*r)->VerifyAll().ok());
  for (const auto& t : testing::MakeModel(1)) CHECK(*(*r)->ReadFull(t.name) == t.bytes);
}

TEST_CASE("kill -9 of a rank mid-save keeps the previous checkpoint", "[checkpoint][multiprocess]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  Cluster c{(*server)->address(), testing::TmpDir("kill")};

  // Step 1 commits normally across two processes.
  auto pids = c.Start("attempt/0/", 2, 1, -1, 30);
  for (pid_t p : pids) CHECK(WaitFor(p, absl::Seconds(30)) == 0);
  CHECK(*ResolveLatest(c.root) == c.root + "/step-1");

  SECTION("rank 1 killed while writing its shard") {
    pids = c.Start("attempt/1/", 2, 2, /*slow_rank=*/1, /*timeout_s=*/3);
    REQUIRE(WaitForFile(c.root + "/.tmp-step-2/rank-00001.safetensors", absl::Seconds(20)));
    absl::SleepFor(absl::Milliseconds(300));
    kill(pids[1], SIGKILL);
    CHECK(WaitFor(pids[1], absl::Seconds(10)) == -SIGKILL);
    CHECK(WaitFor(pids[0], absl::Seconds(20)) == 1);  // rank 0 times out waiting for rank 1
    CheckStep1IsLatestAndGood(c.root);
  }
  SECTION("rank 0 killed while writing, before it could commit") {
    pids = c.Start("attempt/1/", 2, 2, /*slow_rank=*/0, /*timeout_s=*/3);
    REQUIRE(WaitForFile(c.root + "/.tmp-step-2/rank-00000.safetensors", absl::Seconds(20)));
    absl::SleepFor(absl::Milliseconds(300));
    kill(pids[0], SIGKILL);
    CHECK(WaitFor(pids[0], absl::Seconds(10)) == -SIGKILL);
    CHECK(WaitFor(pids[1], absl::Seconds(20)) == 1);  // rank 1 never hears an outcome
    CheckStep1IsLatestAndGood(c.root);
  }
  // The next attempt saves step 2 over the leftovers and commits it.
  pids = c.Start("attempt/2/", 2, 2, -1, 30);
  for (pid_t p : pids) CHECK(WaitFor(p, absl::Seconds(30)) == 0);
  CHECK(*ResolveLatest(c.root) == c.root + "/step-2");
  auto r = CheckpointReader::Open(c.root);
  REQUIRE(r.ok());
  CHECK((*r)->VerifyAll().ok());
  for (const auto& t : testing::MakeModel(2)) CHECK(*(*r)->ReadFull(t.name) == t.bytes);
  CHECK(ListSteps(c.root) == std::vector<int64_t>{1, 2});
}

// A commit protocol whose WaitAllDone first lets a newer attempt take over (bumps the fence), as
// when a partitioned host's rank 0 finishes a save after the job moved on.
class TakeoverDuringSave : public StoreCommitProtocol {
 public:
  TakeoverDuringSave(store::Client stale, store::Client owner)
      : StoreCommitProtocol(std::move(stale)), owner_(std::move(owner)) {}
  absl::StatusOr<std::vector<std::string>> WaitAllDone(int64_t step, int world,
                                                       absl::Duration timeout) override {
    REQUIRE(owner_.Set("jobs/j/fence", "1").ok());
    return StoreCommitProtocol::WaitAllDone(step, world, timeout);
  }

 private:
  store::Client owner_;
};

TEST_CASE("a fenced-off attempt cannot commit a checkpoint", "[checkpoint][fencing]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string root = testing::TmpDir("fence");
  store::ClientOptions o{.address = (*server)->address()};
  auto plain = store::Client::Connect(o);
  o.fence_key = "jobs/j/fence";
  auto attempt0 = store::Client::Connect(o);
  REQUIRE(plain.ok());
  REQUIRE(attempt0.ok());
  const auto model = testing::MakeModel(1);
  const SaveOptions so{.root = root, .rank = 0, .world_size = 1, .commit_timeout = absl::Seconds(10)};
  // Attempt 0 commits step 1; then attempt 1 starts during its save of step 2: refused at the
  // claim, after the votes, before anything becomes visible.
  StoreCommitProtocol p0(attempt0->WithPrefix("jobs/j/a0/"));
  REQUIRE(SaveCheckpoint(so, testing::ShardState(model, 1, 0, 1), &p0).ok());
  TakeoverDuringSave stale(attempt0->WithPrefix("jobs/j/a0/"), *plain);
  absl::Status s = SaveCheckpoint(so, testing::ShardState(testing::MakeModel(2), 2, 0, 1), &stale);
  INFO(s);
  CHECK(store::IsFenced(s));
  CHECK(absl::StrContains(s.message(), "belongs to epoch 0, the fence is at epoch 1"));
  CheckStep1IsLatestAndGood(root);
  // Its next save is refused at its first write (the claim), before any file is written.
  s = SaveCheckpoint(so, testing::ShardState(testing::MakeModel(3), 3, 0, 1), &p0);
  CHECK(store::IsFenced(s));
  CHECK_FALSE(PathExists(root + "/step-3"));
  CHECK_FALSE(PathExists(root + "/.tmp-step-3"));
  CheckStep1IsLatestAndGood(root);
}

}  // namespace
}  // namespace ember::ckpt
