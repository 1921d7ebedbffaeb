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
// CANCELLED, and RUNNING -> RESTARTING -> RUNNING (attempt n+1) while NextStateAfterFailure()
// allows (the decisions are pure functions in scheduler.h). Failure handling (docs/operations.md
// "Failures and restarts"):
//   1. The daemon of a dying worker reaps it within one poll and writes the attempt's `failure`
//      (first writer wins) and `stop` keys; every worker polls `stop` and exits within ~0.1 s after
//      dumping its flight recorder into <job dir>/flight/attempt-<n>/; every daemon also SIGTERMs
//      its ranks of that attempt. A lost node (lease expired) is a failure too: "node lost: <node>",
//      seen by the scheduler or by the node's own daemon (on NOT_FOUND, refused credentials, or
//      lease_ttl without an acknowledged refresh: it stops its workers, sets that stop key once
//      the store answers and registers again; lease.cc).
//   2. The scheduler waits until every rank on a live node reported its exit (bounded by
//      failure_settle), runs `analyze_flight` over the dumps (the verdict goes on the attempt and
//      the reason), then moves the job to RESTARTING (backoff) or FAILED.
//   3. Attempt n+1 is placed like a new job (any healthy nodes) under jobs/<job>/attempt/<n+1>/;
//      the attempt number is the record's attempt count, agreed through compare-and-set.
// Worker pids, their start times and the node lease are persisted in <state_dir>/workers.state;
// Detach() leaves the workers running and a new daemon re-attaches to them at Start().
//
// Thread-safe: every public method may be called from any thread (gRPC handlers do).
#ifndef EMBER_RUNTIME_DAEMON_DAEMON_H_
#define EMBER_RUNTIME_DAEMON_DAEMON_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/jobs.pb.h"
#include "runtime/base/auth.h"
#include "runtime/base/http_server.h"
#include "runtime/daemon/inventory.h"
#include "runtime/daemon/metrics.h"
#include "runtime/store/server.h"

namespace ember::daemon {

struct DaemonOptions {
  std::string node_name;                 // "" = the host name
  std::string listen = "127.0.0.1:0";    // Jobs/Nodes API; loopback by default, port 0 = any
  std::string advertise;                 // address other daemons use; "" = the bound address
  bool host_store = false;               // run the rendezvous store in this process
  std::string store_listen = "127.0.0.1:0";
  std::string store_data_dir;            // durability of the hosted store ("" = memory only)
  std::string store_address;             // the store to join (required without host_store)
  // The hosted store's backend (null = in memory, durable with store_data_dir). emberd's
  // `store: etcd://...` sets an etcd backend here (config.h) and host_store, so that every daemon
  // can host a store server over the same etcd cluster; store_backend_name names it in the logs.
  decltype(store::StoreServerOptions::make_backend) store_backend;
  std::string store_backend_name;
  std::string auth_token;                // "" = auth off (emberd refuses unless told explicitly)
  base::TlsOptions tls;                  // for the APIs and the hosted store
  std::string work_root;                 // job directories: <work_root>/<job id> (required)
  std::string state_dir;                 // "" = <work_root>/.emberd/<node>
  std::string worker_binary;             // what runs a built-in job's ranks (required)
  InventoryOptions inventory;
  bool scheduler = true;                 // take part in the scheduler election
  std::vector<std::string> data_roots;   // absolute paths specs may read from
  // Script jobs (worker.script: the daemon runs `python -u script args` per rank with torchrun's
  // environment, runtime/job/torch_env.h). They run as script_user ("" = this daemon's user; only
  // a root daemon can switch to another, which then owns the job directory, checkpoints/ and
  // flight/, while logs/, uploads/ and .ember/ stay the daemon's: job_files.h). A daemon running as
  // root refuses them unless allow_root_scripts (spec_policy.h ScriptIdentityFor).
  std::string script_user;
  bool allow_root_scripts = false;
  absl::Duration lease_ttl = absl::Seconds(6);
  absl::Duration heartbeat = absl::Seconds(1);  // the node record's rewrite period
  // The lease's refresh period, on a store connection of its own (lease.cc); zero = lease_ttl /
  // 10, at most `heartbeat`. A store outage shorter than about lease_ttl - 2 * lease_refresh
  // keeps the lease; a longer one loses the node (its attempts restart, "node lost: <node>").
  absl::Duration lease_refresh = absl::ZeroDuration();
  absl::Duration poll = absl::Milliseconds(100);
  absl::Duration kill_grace = absl::Seconds(3);  // SIGTERM, then SIGKILL of the process group
  int64_t log_max_bytes = 64 << 20;              // per rank, then rotated (copy-truncate)
  int log_keep = 3;
  int last_log_lines = 20;                       // kept on a failing rank's root cause
  // Restart backoff: attempt k (k >= 1) is placed restart_backoff * 2^(k-1) after attempt k-1
  // ended, at most restart_backoff_max.
  absl::Duration restart_backoff = absl::Seconds(1);
  absl::Duration restart_backoff_max = absl::Seconds(30);
  // How long the scheduler waits for every rank of a failed attempt to report its exit (and so to
  // have dumped its flight recorder) before it decides and analyses anyway.
  absl::Duration failure_settle = absl::Seconds(5);
  // Verdict over a directory of flight-recorder dumps ("" = no problem found / no dumps). emberd
  // wires the flight-recorder analyzer here (//runtime/flight:verdict); null = no analysis.
  // Called on the scheduler's thread; must not block for long. When the verdict's first finding
  // is that other ranks than the first to fail hung ("rank R never joined ..."), it leads the
  // failure reason: the rank whose watchdog fired first is only where the hang was noticed.
  std::function<std::string(const std::string& dir)> analyze_flight;
  // Extra environment for every worker (after the contract variables), e.g. NCCL_* knobs or the
  // test-only EMBER_WORKER_FAULT.
  std::vector<std::pair<std::string, std::string>> worker_env;
  // Workers get SIGKILL when this daemon's control thread (which forks them) ends, including when
  // the process is killed (PR_SET_PDEATHSIG). For `emberctl run --standalone`, where the launcher
  // is the daemon; never for emberd, whose workers outlive a restart (Detach).
  bool workers_die_with_daemon = false;
  // This process becomes a child subreaper (prctl PR_SET_CHILD_SUBREAPER): a rank's descendant
  // that daemonises is re-parented here instead of to init, even one that cleared its environment
  // (which escapes the sweep by environment, process.h KillAttemptProcesses). The control thread
  // reaps such orphans; when an attempt's ranks have all exited, and at Drain, every orphan still
  // running gets SIGKILL. Only for a process that forks nothing else and runs one job at a time:
  // `emberctl run --standalone`.
  bool reap_orphans = false;
  // Each attempt's ranks on this node run in a cgroup v2 of their own (cgroup.h), killed whole
  // when the attempt's ranks have all exited: a descendant that left the process group and
  // cleared its environment (`env -i setsid sleep 1000 &`) ends too. "auto": under emberd's own
  // cgroup v2 (from /proc/self/mountinfo and /proc/self/cgroup), subdirectory ember/, where this
  // process can make groups there and move its children into them; else (no cgroup2, read-only,
  // not permitted) the sweep by environment only, with one log line saying so. A path: that
  // cgroup v2 directory is the parent instead (Start fails naming it when it cannot be used).
  // "off": the sweep by environment only. Under the parent, this daemon's directory is
  // emberd-<hash of work_root and node> (unique per daemon, the same after a restart, removed by
  // Drain; Detach leaves it, while attempts run in it, to the next daemon, which kills and
  // removes the groups of attempts it did not re-attach to).
  std::string process_cgroup = "auto";
  // The job id is "<name>-<submission id>" instead of "<name>-<random>" when a submission id is
  // given: the same submission gets the same job directory in a fresh cluster. For the ephemeral
  // daemons of `emberctl run --slurm`, whose requeued run must find its checkpoints
  // (<job dir>/checkpoints/latest); a long-lived emberd keeps random ids.
  bool job_id_from_submission = false;
  // Retention of finished jobs (SUCCEEDED, FAILED, CANCELLED, devices released) in the store: the
  // scheduler forgets all but the newest keep_finished_jobs, and any that ended longer than
  // finished_job_ttl ago; forgetting deletes the record, the spec, the uploaded files and every
  // attempt key (jobs/<job>/...), the job's index and submission keys. The job directory on disk
  // (logs, checkpoints, metrics) stays. 0 / a zero duration = no limit of that kind.
  int keep_finished_jobs = 100;
  absl::Duration finished_job_ttl = absl::Hours(7 * 24);
  // HTTP endpoint (base::HttpServer): /metrics in the Prometheus text format (metrics.h) and
  // whatever else registers on http_server(). "" = no HTTP server.
  std::string http_listen;
  base::HttpServerOptions http;              // bounds; `listen` is replaced by http_listen
  bool metrics_require_token = true;         // /metrics needs "Authorization: Bearer <auth_token>"
                                             // (no effect when auth_token is empty)
  MetricsOptions metrics;
  // The job page (job_page.h) on the HTTP endpoint is readable without logging in (read-only).
  bool job_page_open = false;
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
  // For a daemon restart (upgrade, `systemctl restart`): stops serving and supervising but leaves
  // the workers running, the devices claimed and the node's lease alive (it expires after
  // lease_ttl unless a new daemon with the same state_dir re-attaches within it). Persists the
  // state first. After Detach the destructor does nothing more. Idempotent.
  void Detach();

  // Liveness for the systemd watchdog: the control loop and the store heartbeat both made progress
  // within the last few intervals.
  bool Healthy() const;
  std::string StatusLine() const;     // "2 jobs, 4 workers, leader" (for sd_notify STATUS=)
  int NumWorkers() const;             // live worker processes on this node

  // The HTTP endpoint ("" / null when http_listen is empty). Handlers registered on it run on its
  // threads until Drain or Detach stops it; they must not outlive the daemon.
  std::string http_address() const;
  base::HttpServer* http_server() const;

  class Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_DAEMON_H_
