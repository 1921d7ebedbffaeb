// End to end: a store and two daemons on loopback run jobs of //tests/e2e:test_worker. Every test
// bounds its waits and ends by draining both daemons; "no worker left" is checked by scanning
// /proc for EMBER_JOB_ID=<job>.
#include <signal.h>

#include <filesystem>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "runtime/daemon/process.h"
#include "runtime/store/client.h"
#include "testing/cluster.h"

namespace ember::e2e {
namespace {

namespace v1 = jobs::v1;
namespace fs = std::filesystem;
using daemon::FindJobProcesses;

template <typename F>
bool WaitFor(F cond, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return cond();
}

int FreeDevices(Client& c) {
  auto nodes = c.Nodes();
  if (!nodes.ok()) return -1;
  int free = 0;
  for (const auto& n : *nodes)
    for (const auto& d : n.devices()) free += d.job_id().empty() ? 1 : 0;
  return free;
}

TEST_CASE("a 4-rank job over two daemons succeeds with logs and a checkpoint") {
  auto cluster = TestCluster::Start();
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(1);  // any daemon answers for the cluster
  REQUIRE(c.ok());
  REQUIRE(WaitFor([&] { auto n = c->Nodes(); return n.ok() && n->size() == 2; }, absl::Seconds(5)));
  auto r = c->Submit(Spec("e2e-ok", 4, 10), "sub-ok-1");
  REQUIRE(r.ok());
  REQUIRE(r->job().state() == v1::PENDING);
  // Idempotent: the same submission id gives the same job.
  auto again = c->Submit(Spec("e2e-ok", 4, 10), "sub-ok-1");
  REQUIRE(again.ok());
  REQUIRE(again->already_existed());
  REQUIRE(again->job().id() == r->job().id());

  const std::string id = r->job().id();
  auto done = c->Wait(id, absl::Seconds(30));
  REQUIRE(done.ok());
  INFO(done->reason());
  REQUIRE(done->state() == v1::SUCCEEDED);
  REQUIRE(done->attempts_size() == 1);
  REQUIRE(done->attempts(0).assignment().nodes_size() == 2);  // gang across both nodes
  REQUIRE(done->progress().metrics().step() == 10);
  for (int rank = 0; rank < 4; ++rank) {
    REQUIRE(fs::exists(absl::StrCat(done->job_dir(), "/checkpoints/step-10/rank-", rank)));
  }
  std::vector<std::string> lines;
  REQUIRE(c->StreamLogs(id, 3, false, 0, [&](const v1::LogLine& l) {
    lines.push_back(l.line());
    return true;
  }).ok());
  REQUIRE(lines.size() >= 10);
  REQUIRE(absl::StrContains(lines.back(), "done"));
  REQUIRE(FindJobProcesses(id).empty());
  REQUIRE(WaitFor([&] { return FreeDevices(*c) == 4; }, absl::Seconds(5)));
  auto list = c->List();
  REQUIRE(list.ok());
  REQUIRE(list->size() == 1);
}

TEST_CASE("a failing rank fails the job with that rank and exit code, leaving no worker") {
  auto cluster = TestCluster::Start();
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  REQUIRE(WaitFor([&] { auto n = c->Nodes(); return n.ok() && n->size() == 2; }, absl::Seconds(5)));
  auto r = c->Submit(Spec("e2e-fail-r1-c3", 4, 100000));
  REQUIRE(r.ok());
  auto done = c->Wait(r->job().id(), absl::Seconds(30));
  REQUIRE(done.ok());
  REQUIRE(done->state() == v1::FAILED);
  INFO(done->reason());
  REQUIRE(done->root_cause().rank() == 1);
  REQUIRE(done->root_cause().exit_code() == 3);
  REQUIRE(absl::StrContains(done->reason(), "rank 1"));
  REQUIRE(absl::StrContains(done->reason(), "code 3"));
  bool saw_reason_line = false;
  for (const auto& l : done->root_cause().last_log_lines())
    saw_reason_line = saw_reason_line || absl::StrContains(l, "failing on purpose");
  REQUIRE(saw_reason_line);
  // The other ranks were stopped (they would run "forever").
  REQUIRE(WaitFor([&] { return FindJobProcesses(r->job().id()).empty(); }, absl::Seconds(5)));
  REQUIRE(WaitFor([&] { return FreeDevices(*c) == 4; }, absl::Seconds(5)));
}

TEST_CASE("cancel stops every worker within 5 s and frees the devices") {
  auto cluster = TestCluster::Start();
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(1);
  REQUIRE(c.ok());
  REQUIRE(WaitFor([&] { auto n = c->Nodes(); return n.ok() && n->size() == 2; }, absl::Seconds(5)));
  auto r = c->Submit(Spec("e2e-hang", 4, 10));
  REQUIRE(r.ok());
  const std::string id = r->job().id();
  REQUIRE(WaitFor([&] { return FindJobProcesses(id).size() == 4; }, absl::Seconds(15)));
  REQUIRE(FreeDevices(*c) == 0);
  absl::Time t0 = absl::Now();
  auto j = c->Cancel(id);
  REQUIRE(j.ok());
  REQUIRE(j->state() == v1::CANCELLED);
  REQUIRE(WaitFor([&] { return FindJobProcesses(id).empty(); }, absl::Seconds(5)));
  REQUIRE(WaitFor([&] { return FreeDevices(*c) == 4; }, absl::Seconds(5)));
  REQUIRE(absl::Now() - t0 < absl::Seconds(5));
  auto again = c->Cancel(id);  // idempotent on a finished job
  REQUIRE(again.ok());
  REQUIRE(again->state() == v1::CANCELLED);
}

TEST_CASE("a job that does not fit waits PENDING and runs after the first") {
  auto cluster = TestCluster::Start();
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  REQUIRE(WaitFor([&] { auto n = c->Nodes(); return n.ok() && n->size() == 2; }, absl::Seconds(5)));
  auto first = c->Submit(Spec("e2e-q-first", 4, 40));
  REQUIRE(first.ok());
  REQUIRE(WaitFor([&] {
    auto j = c->Get(first->job().id());
    return j.ok() && j->state() == v1::RUNNING;
  }, absl::Seconds(10)));
  auto second = c->Submit(Spec("e2e-q-second", 3, 5));
  REQUIRE(second.ok());
  absl::SleepFor(absl::Milliseconds(300));
  auto s = c->Get(second->job().id());
  REQUIRE(s.ok());
  auto f = c->Get(first->job().id());
  REQUIRE(f.ok());
  if (f->state() == v1::RUNNING) REQUIRE(s->state() == v1::PENDING);
  auto fdone = c->Wait(first->job().id(), absl::Seconds(30));
  auto sdone = c->Wait(second->job().id(), absl::Seconds(30));
  REQUIRE(fdone.ok());
  REQUIRE(sdone.ok());
  REQUIRE(fdone->state() == v1::SUCCEEDED);
  REQUIRE(sdone->state() == v1::SUCCEEDED);
  REQUIRE(sdone->attempts(0).start_unix_ms() >= fdone->attempts(0).end_unix_ms() - 200);
}

TEST_CASE("a wrong or missing token is UNAUTHENTICATED and changes nothing") {
  auto cluster = TestCluster::Start({.nodes = 1});
  REQUIRE(cluster.ok());
  std::string wrong = "0123456789abcdef0123456789abcdef";
  std::string none;
  for (const std::string* t : {&wrong, &none}) {
    auto bad = (*cluster)->Connect(0, t);
    REQUIRE(bad.ok());
    auto r = bad->Submit(Spec("e2e-auth", 1, 1));
    REQUIRE(absl::IsUnauthenticated(r.status()));
    REQUIRE(absl::IsUnauthenticated(bad->List().status()));
    REQUIRE(absl::IsUnauthenticated(bad->Nodes().status()));
    REQUIRE(absl::IsUnauthenticated(bad->Cancel("x").status()));
  }
  // The hosted store demands the token too.
  store::ClientOptions so;
  so.address = (*cluster)->node(0)->store_address();
  so.auth_token = wrong;
  so.connect_timeout = absl::Seconds(2);
  so.default_timeout = absl::Seconds(2);
  auto sc = store::Client::Connect(so);
  if (sc.ok()) REQUIRE(absl::IsUnauthenticated(sc->Set("jobs/x/record", "evil")));
  auto good = (*cluster)->Connect(0);
  REQUIRE(good.ok());
  auto list = good->List();
  REQUIRE(list.ok());
  REQUIRE(list->empty());
}

TEST_CASE("malformed specs are INVALID_ARGUMENT naming the field; the daemon stays up") {
  auto cluster = TestCluster::Start({.nodes = 1});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  struct Case {
    std::string yaml, field;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {"name: x\nsteps: -5\n", "steps", absl::StatusCode::kInvalidArgument},
      {"name: x\nmodel: {mlp: relu}\n", "model.mlp", absl::StatusCode::kInvalidArgument},
      {"name: x\ncommand: /bin/sh\n", "command", absl::StatusCode::kInvalidArgument},
      {"name: x\nexecutable: /bin/sh\n", "executable", absl::StatusCode::kInvalidArgument},
      {"name: x\ndata: {path: /etc/passwd}\n", "data.path", absl::StatusCode::kPermissionDenied},
      {"name: x\ncheckpoint: {dir: ../../etc}\n", "checkpoint.dir",
       absl::StatusCode::kInvalidArgument},
      {"name: x\nparallelism: {world_size: lots}\n", "parallelism.world_size",
       absl::StatusCode::kInvalidArgument},
      // Submit-time validation (issue 13): non-finite floats, an empty spec, an explicit 0,
      // duplicate keys, and job names that would be taken as options, paths or forged log lines.
      {"name: x\noptimizer: {lr: .nan}\n", "optimizer.lr: '.nan' is not a finite number",
       absl::StatusCode::kInvalidArgument},
      {"name: x\noptimizer: {lr: .inf}\n", "optimizer.lr", absl::StatusCode::kInvalidArgument},
      {"", "spec: empty", absl::StatusCode::kInvalidArgument},
      {"# nothing but a comment\n", "spec: empty", absl::StatusCode::kInvalidArgument},
      {"name: x\nsteps: 0\n", "steps: 0 is out of range", absl::StatusCode::kInvalidArgument},
      {"name: x\nsteps: 3\nsteps: 4\n", "steps: duplicate key on line 3",
       absl::StatusCode::kInvalidArgument},
      {"name: .\n", "name: '.'", absl::StatusCode::kInvalidArgument},
      {"name: ..\n", "name: '..'", absl::StatusCode::kInvalidArgument},
      {"name: -x\n", "name: '-x'", absl::StatusCode::kInvalidArgument},
      {"name: \"x\\n[info] forged\"\n", "name: 'x\\n[info] forged'",
       absl::StatusCode::kInvalidArgument},
  };
  for (const Case& k : cases) {
    auto r = c->Submit(k.yaml);
    INFO(k.yaml << " -> " << r.status());
    REQUIRE(r.status().code() == k.code);
    REQUIRE(absl::StrContains(r.status().message(), k.field));
  }
  // Uploads cannot escape the job directory.
  auto up = c->Submit(Spec("e2e-up", 1, 1), "", {{"../evil", "x"}});
  REQUIRE(absl::IsPermissionDenied(up.status()));

  // A fuzzed corpus: byte flips, truncations and insertions of a valid spec.
  std::mt19937 rng(1234);
  std::string base = Spec("e2e-fuzz", 1, 1) + "optimizer: {lr: 0.001, schedule: cosine}\n";
  const std::string alphabet = "{}[]:,-\n \"'#&*!|>%@`0123456789abcxyz.\t\\";
  int rejected = 0;
  for (int i = 0; i < 200; ++i) {
    std::string s = base;
    int edits = 1 + rng() % 4;
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: s.resize(pos); break;
        default: s.insert(pos, 1, alphabet[rng() % alphabet.size()]);
      }
    }
    auto r = c->Submit(s);
    INFO(s << " -> " << r.status());
    if (r.ok()) {
      (void)c->Cancel(r->job().id());
      continue;
    }
    // INVALID_ARGUMENT, or FAILED_PRECONDITION for a world size the node can never hold.
    REQUIRE((r.status().code() == absl::StatusCode::kInvalidArgument ||
             r.status().code() == absl::StatusCode::kFailedPrecondition));
    REQUIRE(!r.status().message().empty());
    ++rejected;
  }
  REQUIRE(rejected > 50);
  auto nodes = c->Nodes();  // still up
  REQUIRE(nodes.ok());
  REQUIRE((*cluster)->node(0)->Healthy());
}

}  // namespace
}  // namespace ember::e2e
