// emberd: the node daemon. One per node; every daemon serves the Jobs and Nodes APIs for the whole
// cluster (job records live in the store), supervises the workers placed on its node, and the
// elected one (scheduler/leader) places pending jobs.
//
//   DaemonOptions o;
//   o.host_store = true;                       // single-node cluster in one process
//   o.auth_token = token; o.work_root = "/var/lib/ember/jobs"; o.worker_binary = ".../ember-worker";
//   ASSIGN_OR_RETURN(std::unique_ptr<Daemon> d, Daemon::Start(o));
//   ... d->address() ...                       // Jobs/Nodes endpoint; d->store_address() for workers
//   d->Drain();                                // or the destructor: stop workers, deregister
//
// Supervision state machine (per job; the scheduler owns the transitions, all by compare-and-set on
// the job record): PENDING -> RUNNING (attempt n placed) -> SUCCEEDED | FAILED(reason) |
// CANCELLED; a failed attempt goes through NextStateAfterFailure(), which is where issue 8's
// RESTARTING (attempt n+1 from the last checkpoint) plugs in. Worker pids are persisted under
// state_dir so a restarted daemon can re-attach (issue 8).
//
// Thread-safe: every public method may be called from any thread (gRPC handlers do).
#ifndef EMBER_RUNTIME_DAEMON_DAEMON_H_
#define EMBER_RUNTIME_DAEMON_DAEMON_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/jobs.pb.h"
#include "runtime/daemon/auth.h"
#include "runtime/daemon/inventory.h"

namespace ember::daemon {

struct DaemonOptions {
  std::string node_name;                 // "" = the host name
  std::string listen = "127.0.0.1:0";    // Jobs/Nodes API; loopback by default, port 0 = any
  std::string advertise;                 // address other daemons use; "" = the bound address
  bool host_store = false;               // run the rendezvous store in this process
  std::string store_listen = "127.0.0.1:0";
  std::string store_data_dir;            // durability of the hosted store ("" = memory only)
  std::string store_address;             // the store to join (required without host_store)
  std::string auth_token;                // "" = auth off (emberd refuses unless told explicitly)
  TlsOptions tls;                        // for the APIs and the hosted store
  std::string work_root;                 // job directories: <work_root>/<job id> (required)
  std::string state_dir;                 // "" = <work_root>/.emberd/<node>
  std::string worker_binary;             // the only executable a daemon ever runs (required)
  InventoryOptions inventory;
  bool scheduler = true;                 // take part in the scheduler election
  std::vector<std::string> data_roots;   // absolute paths specs may read from
  std::string cgroup_root;               // "" = no cgroups; else a delegated cgroup v2 directory
  absl::Duration lease_ttl = absl::Seconds(6);
  absl::Duration heartbeat = absl::Seconds(1);
  absl::Duration poll = absl::Milliseconds(100);
  absl::Duration kill_grace = absl::Seconds(3);  // SIGTERM, then SIGKILL of the process group
  int64_t log_max_bytes = 64 << 20;              // per rank, then rotated (copy-truncate)
  int log_keep = 3;
  int last_log_lines = 20;                       // kept on a failing rank's root cause
};

class Daemon {
 public:
  // Binds, inventories devices, connects to (or hosts) the store and registers the node. When it
  // returns OK the daemon is ready (the moment for sd_notify READY=1).
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();  // Drain()

  std::string address() const;        // bound Jobs/Nodes endpoint
  int port() const;
  std::string store_address() const;  // what workers get as EMBER_STORE_ADDR
  const std::string& node_name() const;

  // No new jobs; stops this node's workers (SIGTERM, then SIGKILL after kill_grace), releases its
  // devices, deregisters. Blocks until done. Idempotent.
  void Drain();

  // Liveness for the systemd watchdog: the control loop and the store heartbeat both made progress
  // within the last few intervals.
  bool Healthy() const;
  std::string StatusLine() const;     // "2 jobs, 4 workers, leader" (for sd_notify STATUS=)
  int NumWorkers() const;             // live worker processes on this node

  class Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What a failed attempt leads to. Today always FAILED; issue 8 returns RESTARTING while
// attempts <= spec.max_restarts.
jobs::v1::JobState NextStateAfterFailure(const jobs::v1::Job& job);

// "rank 1 on node-a exited with code 3" / "rank 0 on node-a was killed by signal 9 (SIGKILL)".
std::string DescribeExit(const jobs::v1::RankExit& e);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_DAEMON_H_
