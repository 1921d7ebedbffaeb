#include "testing/cluster.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/flight/verdict.h"
#include "runtime/base/status_macros.h"

namespace ember::e2e {

namespace fs = std::filesystem;

std::string Spec(const std::string& name, int world, int steps) {
  return absl::StrCat("name: ", name, "\nmodel: {n_layers: 1, d_model: 32, n_heads: 2, ",
                      "context_length: 16}\nparallelism: {strategy: fsdp, world_size: ", world,
                      "}\nsteps: ", steps, "\n");
}

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::Start(ClusterOptions o) {
  auto c = std::unique_ptr<TestCluster>(new TestCluster());
  const char* tmp = getenv("TEST_TMPDIR");
  c->work_root_ = absl::StrCat(tmp ? tmp : "/tmp", "/e2e-", getpid(), "-", rand() % 100000);
  c->token_ = o.token.empty() ? base::GenerateToken() : o.token;
  std::string worker = o.worker.empty() ? fs::absolute("tests/e2e/test_worker").string() : o.worker;
  for (int i = 0; i < o.nodes; ++i) {
    daemon::DaemonOptions d;
    d.node_name = std::string("node-") + char('a' + i);
    d.host_store = i == 0 && o.store_address.empty();
    if (!d.host_store) {
      d.store_address = o.store_address.empty() ? c->daemons_[0]->store_address() : o.store_address;
    }
    d.auth_token = c->token_;
    d.work_root = c->work_root_;
    d.worker_binary = worker;
    d.inventory.cpu_slots = o.slots;
    d.inventory.cuda_devices = o.cuda;
    d.poll = absl::Milliseconds(50);
    d.heartbeat = absl::Milliseconds(250);
    d.lease_ttl = o.lease_ttl;
    d.kill_grace = absl::Seconds(1);
    d.restart_backoff = o.restart_backoff;
    d.failure_settle = absl::Seconds(3);
    d.analyze_flight = FlightVerdict;
    d.worker_env = o.worker_env;
    d.data_roots = o.data_roots;
    d.keep_finished_jobs = o.keep_finished_jobs;
    ASSIGN_OR_RETURN(auto daemon, daemon::Daemon::Start(d));
    c->options_.push_back(d);
    c->daemons_.push_back(std::move(daemon));
  }
  return c;
}

TestCluster::~TestCluster() {
  for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) {
    if (*it) (*it)->Drain();
  }
  daemons_.clear();
}

void TestCluster::Detach(int i) {
  daemons_[i]->Detach();
  daemons_[i].reset();
}

absl::Status TestCluster::StartAgain(int i) {
  ASSIGN_OR_RETURN(daemons_[i], daemon::Daemon::Start(options_[i]));
  return absl::OkStatus();
}

absl::StatusOr<Client> TestCluster::Connect(int i, const std::string* token) const {
  ClientOptions o;
  o.address = daemons_[i]->address();
  o.token = token ? *token : token_;
  return Client::Connect(o);
}

}  // namespace ember::e2e
