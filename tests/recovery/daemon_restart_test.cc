// Daemon failures end to end: emberd processes (kill -9 is real) over a store in this process,
// running //tests/e2e:test_worker (and the real ember-worker where said).
//   * kill -9 and restart of the daemon that runs a job -> the new daemon re-attaches to the
//     workers from <state_dir>/workers.state, the job keeps its attempt and SUCCEEDS (with the
//     stand-in and with the real ember-worker);
//   * kill -9 of that daemon for good -> "node lost: <node>" within the lease timeout, the job
//     restarts on the other node and SUCCEEDS; the lost node's workers stop on the stop key.
// No process is left behind (/proc scan); the store lives here, so workers of a crashed test exit.
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "launcher/client.h"
#include "runtime/base/auth.h"
#include "runtime/daemon/process.h"
#include "runtime/store/server.h"
#include "testing/harness.h"

namespace ember::recovery {
namespace {

namespace v1 = jobs::v1;
namespace fs = std::filesystem;
using daemon::FindJobProcesses;

struct Cluster {
  std::unique_ptr<store::StoreServer> store;
  std::string token, token_file, work_root;
  EmberdProcess::Options base;
  std::map<std::string, std::unique_ptr<EmberdProcess>> daemons;

  static std::unique_ptr<Cluster> Start() {
    auto c = std::make_unique<Cluster>();
    const char* tmp = getenv("TEST_TMPDIR");
    c->work_root = absl::StrCat(tmp ? tmp : "/tmp", "/rec-", getpid(), "-", rand() % 100000);
    fs::create_directories(c->work_root);
    c->token = base::GenerateToken();
    c->token_file = c->work_root + "/token";
    std::ofstream(c->token_file) << c->token << "\n";
    fs::permissions(c->token_file, fs::perms::owner_read | fs::perms::owner_write);
    store::StoreServerOptions so;
    so.auth_token = c->token;
    auto s = store::StoreServer::Start(so);
    if (!s.ok()) return nullptr;
    c->store = std::move(*s);
    c->base.emberd = fs::absolute("runtime/daemon/emberd").string();
    c->base.worker = fs::absolute("tests/e2e/test_worker").string();
    c->base.store = c->store->address();
    c->base.token_file = c->token_file;
    c->base.work_root = c->work_root;
    return c;
  }
  absl::Status StartDaemon(const std::string& node, int incarnation) {
    EmberdProcess::Options o = base;
    o.node = node;
    auto d = EmberdProcess::Start(o, incarnation);
    if (!d.ok()) return d.status();
    daemons[node] = std::move(*d);
    return absl::OkStatus();
  }
  absl::StatusOr<Client> Connect(const std::string& node) {
    ClientOptions o;
    o.address = daemons[node]->address();
    o.token = token;
    return Client::Connect(o);
  }
  ~Cluster() {
    daemons.clear();  // SIGINT: drain
    if (store) store->Shutdown();
  }
};

// Long enough for a kill -9 and a daemon restart while the real worker trains.
constexpr int kRealSteps = 1500;

std::string Holder(const v1::Job& j) {
  if (j.attempts_size() == 0) return "";
  const auto& a = j.attempts(j.attempts_size() - 1).assignment();
  return a.nodes_size() == 1 ? a.nodes(0).node() : "";
}

// Starts daemons node-a and node-b, submits `spec` through node-a and waits until the job runs
// (step >= 5) on one node. Returns the job id and the node holding it.
struct RunningJob {
  std::string id, holder, other;
};
RunningJob StartTwoNodesAndJob(Cluster& c, const std::string& spec,
                                const std::map<std::string, std::string>& files = {}) {
  RunningJob out;
  REQUIRE(c.StartDaemon("node-a", 0).ok());
  REQUIRE(c.StartDaemon("node-b", 0).ok());
  auto cl = c.Connect("node-a");
  REQUIRE(cl.ok());
  REQUIRE(WaitFor([&] { auto n = cl->Nodes(); return n.ok() && n->size() == 2; }, absl::Seconds(5)));
  auto r = cl->Submit(spec, "", files);
  REQUIRE(r.ok());
  out.id = r->job().id();
  REQUIRE(WaitFor([&] {
    auto j = cl->Get(out.id);
    if (!j.ok() || j->progress().metrics().step() < 5) return false;
    out.holder = Holder(*j);
    return !out.holder.empty();
  }, absl::Seconds(15)));
  out.other = out.holder == "node-a" ? "node-b" : "node-a";
  return out;
}

TEST_CASE("kill -9 and restart of a daemon: the job keeps running and finishes") {
  auto c = Cluster::Start();
  REQUIRE(c);
  const RunningJob job = StartTwoNodesAndJob(*c, "name: rec-reattach\nparallelism: {strategy: fsdp, world_size: 2}\n"
                                                 "steps: 250\n");
  const std::string& id = job.id;
  const std::string& holder = job.holder;
  const auto before = FindJobProcesses(id);
  REQUIRE(before.size() == 2);
  c->daemons[holder]->Kill9();
  REQUIRE(FindJobProcesses(id).size() == 2);  // the workers outlive their daemon
  REQUIRE(c->StartDaemon(holder, 1).ok());
  auto other = c->Connect(job.other);
  REQUIRE(other.ok());
  auto done = other->Wait(id, absl::Seconds(30));
  REQUIRE(done.ok());
  INFO(done->reason());
  REQUIRE(done->state() == v1::SUCCEEDED);
  REQUIRE(done->attempts_size() == 1);  // never restarted: re-attached
  REQUIRE(absl::StrContains(ReadFile(c->daemons[holder]->log()), "re-attached to 2 running"));
  REQUIRE(WaitFor([&] { return FindJobProcesses(id).empty(); }, absl::Seconds(5)));
}

TEST_CASE("kill -9 and restart of a daemon running the real ember-worker: re-attached, finishes") {
  auto c = Cluster::Start();
  REQUIRE(c);
  c->base.worker = fs::absolute("runtime/worker/ember-worker").string();
  const RunningJob job = StartTwoNodesAndJob(
      *c, TinySpec("rec-reattach-real", 2, kRealSteps, kRealSteps), {{"data/tiny_corpus.txt", Corpus()}});
  const std::string& id = job.id;
  const std::string& holder = job.holder;
  REQUIRE(FindJobProcesses(id).size() == 2);
  c->daemons[holder]->Kill9();
  REQUIRE(FindJobProcesses(id).size() == 2);  // the workers outlive their daemon
  REQUIRE(c->StartDaemon(holder, 1).ok());
  auto other = c->Connect(job.other);
  REQUIRE(other.ok());
  auto done = other->Wait(id, absl::Seconds(90));
  REQUIRE(done.ok());
  INFO(done->reason());
  REQUIRE(absl::StrContains(ReadFile(c->daemons[holder]->log()), "re-attached to 2 running"));
  REQUIRE(done->state() == v1::SUCCEEDED);
  REQUIRE(done->attempts_size() == 1);  // never restarted: re-attached
  REQUIRE(done->progress().metrics().step() == kRealSteps);
  // The exit status of a non-child came from the worker's own worker_exit key: 0 for both ranks.
  REQUIRE(WaitFor([&] { return FindJobProcesses(id).empty(); }, absl::Seconds(5)));
}

TEST_CASE("SIGTERM detaches (workers keep running, a new daemon adopts them); SIGINT drains") {
  auto c = Cluster::Start();
  REQUIRE(c);
  const RunningJob job = StartTwoNodesAndJob(*c, "name: rec-detach\nparallelism: {strategy: fsdp, world_size: 2}\n"
                                                 "steps: 300\nmax_restarts: 1\n");
  const std::string& id = job.id;
  const std::string& holder = job.holder;
  const std::string& other = job.other;
  auto co = c->Connect(other);
  REQUIRE(co.ok());
  REQUIRE(c->daemons[holder]->Signal(SIGTERM) == 0);
  REQUIRE(FindJobProcesses(id).size() == 2);  // detached, not stopped
  REQUIRE(c->StartDaemon(holder, 1).ok());
  REQUIRE(WaitFor([&] {
    return absl::StrContains(ReadFile(c->daemons[holder]->log()), "re-attached to 2 running");
  }, absl::Seconds(5)));
  // Now drain it: its ranks stop, the job restarts on the other node with the reason.
  REQUIRE(c->daemons[holder]->Signal(SIGINT) == 0);
  REQUIRE(WaitFor([&] {
    auto j = co->Get(id);
    return j.ok() && j->attempts_size() == 2 && j->state() == v1::RUNNING;
  }, absl::Seconds(15)));
  auto j = co->Get(id);
  REQUIRE(j.ok());
  INFO(j->attempts(0).reason());
  REQUIRE(absl::StrContains(j->attempts(0).reason(), "node " + holder + " draining"));
  REQUIRE(Holder(*j) == other);
  REQUIRE(co->Cancel(id).ok());
  REQUIRE(WaitFor([&] { return FindJobProcesses(id).empty(); }, absl::Seconds(5)));
}

TEST_CASE("kill -9 of a daemon: node lost within the lease, restart on the other node") {
  auto c = Cluster::Start();
  REQUIRE(c);
  const RunningJob job = StartTwoNodesAndJob(*c, "name: rec-lost\nparallelism: {strategy: fsdp, world_size: 2}\n"
                                                 "steps: 150\nmax_restarts: 1\n");
  const std::string& id = job.id;
  const std::string& holder = job.holder;
  const std::string& survivor = job.other;
  auto cs = c->Connect(survivor);
  REQUIRE(cs.ok());
  c->daemons[holder]->Kill9();
  const absl::Time t0 = absl::Now();
  std::string reason;
  REQUIRE(WaitFor([&] {
    auto j = cs->Get(id);
    if (!j.ok() || j->attempts(0).reason().empty()) return false;
    reason = j->attempts(0).reason();
    return true;
  }, absl::Seconds(15)));
  const absl::Duration noticed = absl::Now() - t0;
  INFO(reason);
  REQUIRE(absl::StrContains(reason, "node lost: " + holder));
  REQUIRE(noticed < absl::Seconds(3 + 3));  // lease TTL 3 s, then one scheduling pass
  auto done = cs->Wait(id, absl::Seconds(30));
  REQUIRE(done.ok());
  INFO(done->reason());
  REQUIRE(done->state() == v1::SUCCEEDED);
  REQUIRE(done->attempts_size() == 2);
  REQUIRE(Holder(*done) == survivor);
  // The lost node's workers saw the stop key and exited on their own.
  REQUIRE(WaitFor([&] { return FindJobProcesses(id).empty(); }, absl::Seconds(5)));
  WARN("kill -9 of " << holder << " -> node lost noticed after " << absl::FormatDuration(noticed));
}

}  // namespace
}  // namespace ember::recovery
