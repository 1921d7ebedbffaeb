// Internal: the daemon's state, shared by daemon.cc (supervision, scheduling, registration) and
// service.cc (the Jobs and Nodes RPC handlers). Not part of the public API.
#ifndef EMBER_RUNTIME_DAEMON_DAEMON_IMPL_H_
#define EMBER_RUNTIME_DAEMON_DAEMON_IMPL_H_

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "proto/jobs.grpc.pb.h"
#include "runtime/base/grpc_server.h"
#include "runtime/daemon/daemon.h"
#include "runtime/daemon/placement.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"

namespace ember::daemon {

using jobs::v1::Job;
using jobs::v1::JobState;

struct LocalWorker {
  int rank = 0;
  int local_rank = 0;
  std::string device;
  std::string log_path;
  pid_t pid = 0;  // == its process group id (setsid)
  int64_t start_ticks = 0;  // /proc/<pid>/stat starttime: tells our worker from a reused pid
  bool adopted = false;     // re-attached after a daemon restart: maybe not our child
  bool exited = false;
  int exit_code = 0;
  int signal = 0;
};

// One attempt of one job as this node runs it.
struct LocalAttempt {
  std::string job;
  int attempt = 0;
  std::vector<LocalWorker> workers;
  std::vector<std::string> devices;
  bool stopping = false;
  std::string stop_reason;
  absl::Time term_sent = absl::InfinitePast();
  bool released = false;  // every worker reaped and the devices given back
};

class Daemon::Impl {
 public:
  explicit Impl(DaemonOptions o) : opts(std::move(o)) {}

  // ---- Constant after Start.
  DaemonOptions opts;
  std::unique_ptr<Inventory> inventory;
  std::unique_ptr<store::StoreServer> hosted_store;
  std::optional<store::Client> store;
  std::string store_addr;
  std::string token_file;  // handed to workers (EMBER_AUTH_TOKEN_FILE)
  std::string advertise;
  std::unique_ptr<grpc::Service> jobs_service, nodes_service;
  base::StartedServer server;

  // ---- Self-synchronized.
  std::atomic<bool> draining{false};
  std::atomic<bool> leader{false};
  std::atomic<int64_t> lease{0};
  std::atomic<int64_t> last_tick_ms{0}, last_heartbeat_ms{0};
  absl::Notification stop;
  std::thread control_thread, heartbeat_thread;

  // ---- Guarded.
  mutable absl::Mutex mu;
  std::map<std::string, LocalAttempt> local ABSL_GUARDED_BY(mu);  // key: "<job>#<attempt>"
  bool drained ABSL_GUARDED_BY(mu) = false;  // Drain or Detach ran

  // ---- Control thread only (Schedule): when the leader first saw each failed attempt.
  std::map<std::string, absl::Time> failing_since;
  absl::Time last_retention = absl::InfinitePast();
  // The kernel's OOM-kill count at the previous Supervise pass (-1 = not read yet), and when it
  // last rose: a worker reaped with SIGKILL soon after was killed by the OOM killer.
  int64_t oom_kills_seen = -1;
  absl::Time last_oom_kill = absl::InfinitePast();

  // daemon.cc
  absl::Status Init();
  void ControlLoop();
  void HeartbeatLoop();
  absl::Status Register();
  void Tick();
  void Schedule();
  void Supervise();
  void SpawnAttempt(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void StopAttempt(LocalAttempt* a, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void PersistLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Reads <state_dir>/workers.state (before the loops start): the lease to keep and the workers to
  // re-attach to (those whose pid still has the recorded start time).
  void LoadState();
  // Non-blocking: true when `w` has ended (exit_code/signal set; for an adopted non-child the
  // status comes from the worker's own worker_exit/<rank> key, else "unknown").
  bool Reap(const LocalAttempt& a, LocalWorker* w, std::string* note);
  // The scheduler's handling of a RUNNING job's current attempt (failure, success).
  void CheckAttempt(const Job& job, const std::set<std::string>& alive);
  // Retention (leader, at most every 2 s): forgets finished jobs per keep_finished_jobs and
  // finished_job_ttl (JobsToForget).
  void ForgetFinished();
  void DrainNow();
  void DetachNow();
  std::string JobDir(const std::string& job) const;

  // Store helpers (daemon.cc). ReadRecord returns the job and the raw bytes for compare-and-set.
  absl::StatusOr<std::pair<Job, std::string>> ReadRecord(const std::string& id);
  // Applies `mutate` to the record with compare-and-set, retrying on races. `mutate` returns
  // false to leave the record unchanged.
  absl::StatusOr<Job> UpdateRecord(const std::string& id, const std::function<bool(Job*)>& mutate);
  absl::StatusOr<std::vector<jobs::v1::Node>> ReadNodes();
  absl::StatusOr<std::map<std::string, std::string>> ReadAllocs();  // "node/device" -> job
  void FillProgress(Job* job);
};

int64_t NowMs();
bool IsTerminal(JobState s);

// The scheduler's view of the registered nodes: every device, and those a job holds (`allocs`:
// "node/device" -> job, from ReadAllocs).
std::vector<NodeDevices> Snapshot(const std::vector<jobs::v1::Node>& nodes,
                                  const std::map<std::string, std::string>& allocs);
// The gang a job asks for (world size, resources.nodes, resources.devices_per_node).
GangRequest RequestOf(const Job& job);

// service.cc
std::unique_ptr<grpc::Service> MakeJobsService(Daemon::Impl* d);
std::unique_ptr<grpc::Service> MakeNodesService(Daemon::Impl* d);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_DAEMON_IMPL_H_
