// Test harness: a store and two daemons ("node-a" hosts the store, "node-b" joins it) on loopback
// in this process, each offering `slots` CPU devices, running //tests/e2e:test_worker (or the
// worker given). Destroying it drains both daemons: no worker survives a test. Thread-compatible.
#ifndef EMBER_TESTING_CLUSTER_H_
#define EMBER_TESTING_CLUSTER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launcher/client.h"
#include "runtime/daemon/daemon.h"

namespace ember::e2e {

struct ClusterOptions {
  int nodes = 2;
  int slots = 2;              // CPU devices per node
  int cuda = 0;               // CUDA devices offered per node (counted only: nothing runs on them)
  std::string worker;         // "" = tests/e2e/test_worker from the runfiles
  std::vector<std::pair<std::string, std::string>> worker_env;  // DaemonOptions::worker_env
  absl::Duration restart_backoff = absl::Milliseconds(200);     // emberd's default is 1 s
  std::vector<std::string> data_roots;                          // DaemonOptions::data_roots
  int keep_finished_jobs = 100;                                 // DaemonOptions retention
  std::string store_address;  // "" = node-a hosts the store; else every node joins this one
  std::string token;          // "" = a fresh one
  absl::Duration lease_ttl = absl::Seconds(3);                   // emberd's default is 6 s
};

class TestCluster {
 public:
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start(ClusterOptions o = {});
  ~TestCluster();

  // A client of node `i`'s daemon with the cluster token (or `token` when given).
  absl::StatusOr<Client> Connect(int i = 0, const std::string* token = nullptr) const;
  daemon::Daemon* node(int i) { return daemons_[i].get(); }  // null while detached
  // A daemon restart: Detach() stops node i's daemon but leaves its workers running, their devices
  // claimed and its lease alive (until it expires); StartAgain() starts it with the same options
  // and state directory, so it re-attaches to them (daemon.h).
  void Detach(int i);
  absl::Status StartAgain(int i);
  const std::string& token() const { return token_; }
  const std::string& work_root() const { return work_root_; }

 private:
  std::string token_, work_root_;
  std::vector<daemon::DaemonOptions> options_;  // per node, as started
  std::vector<std::unique_ptr<daemon::Daemon>> daemons_;
};

std::string Spec(const std::string& name, int world, int steps);

}  // namespace ember::e2e

#endif  // EMBER_TESTING_CLUSTER_H_
