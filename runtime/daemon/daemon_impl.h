// Internal: the daemon's state, shared by its files: daemon.cc (start-up, the loops, registration,
// drain/detach), schedule.cc (the leader's pass, executing scheduler.h's decisions), supervise.cc
// (forking, reaping, stopping workers), worker_state.cc (workers.state), records.cc (job records in
// the store), service.cc (the Jobs and Nodes RPC handlers) and script_job.cc (script jobs: their
// environment, user and per-attempt TCPStore listener). Not part of the public API.
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
#include "runtime/base/clock.h"
#include "runtime/base/grpc_server.h"
#include "runtime/base/http_server.h"
#include "runtime/daemon/cgroup.h"
#include "runtime/daemon/daemon.h"
#include "runtime/daemon/metrics.h"
#include "runtime/daemon/placement.h"
#include "runtime/daemon/job_files.h"
#include "runtime/daemon/process.h"
#include "runtime/daemon/scheduler.h"
#include "runtime/daemon/series.h"
#include "runtime/daemon/spec_policy.h"
#include "runtime/job/env.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/store/tcpstore_server.h"

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
  // Stopped by the lease keeper for a lost node: its stop key (stop_reason) is written before any
  // exit of its ranks is reported, so the scheduler records the lost node, not the SIGTERMs.
  bool stop_key_pending = false;
  absl::Time started = absl::InfinitePast();  // when this daemon forked it (standby.cc's delay)
};

// Warm standby interpreters of one script job for its next attempt on this node (standby.cc).
struct Standby {
  int attempt = 0;                  // the attempt they wait for
  std::vector<LocalWorker> workers; // rank, device, log and pid of each waiting interpreter
};

class Daemon::Impl {
 public:
  explicit Impl(DaemonOptions o);

  // ---- Constant after Start.
  DaemonOptions opts;
  const base::Clock* const clock;  // the scheduler's and supervision's time (RealClock)
  std::unique_ptr<Inventory> inventory;
  std::unique_ptr<store::StoreServer> hosted_store;
  std::optional<store::Client> store;
  std::string store_addr;
  std::shared_ptr<grpc::ChannelCredentials> store_credentials;  // null: plaintext
  std::string token_file;  // handed to workers (EMBER_AUTH_TOKEN_FILE)
  std::string advertise;
  std::unique_ptr<grpc::Service> jobs_service, nodes_service;
  base::StartedServer server;
  // The attempts' cgroups (DaemonOptions::process_cgroup); null: the sweep by environment only.
  std::unique_ptr<ProcessCgroups> cgroups;

  // ---- Script jobs' per-attempt TCPStore listeners (script_job.cc), on this node when it runs
  // the attempt's rank 0. Declared after hosted_store: destroyed first (they borrow its backend).
  absl::Mutex torch_mu;
  std::map<std::string, std::unique_ptr<store::TcpStoreServer>> torch_stores
      ABSL_GUARDED_BY(torch_mu);                                 // key: "<job>#<attempt>"
  std::map<std::string, std::set<int>> torch_ports ABSL_GUARDED_BY(torch_mu);  // job -> ports used
  std::unique_ptr<store::Backend> torch_backend ABSL_GUARDED_BY(torch_mu);  // without hosted_store

  // ---- Self-synchronized.
  std::atomic<bool> draining{false};
  std::atomic<bool> leader{false};
  std::atomic<int64_t> lease{0};
  // The lease keeper found the node lost and has not registered it again (lease.cc): the
  // heartbeat does not write the node record meanwhile.
  std::atomic<bool> lease_lost{false};
  std::atomic<int64_t> last_tick_ms{0}, last_heartbeat_ms{0};
  absl::Notification stop;
  SeriesReader series;  // metric series of the jobs' metrics files (the API and the job page)
  std::thread control_thread, heartbeat_thread, lease_thread;

  // ---- Guarded. The lock rule: `mu` protects `local` and `drained` and nothing else, and is held
  // only to read or merge them: never across a store call, a fork, a wait for a process or a file
  // write. Supervision copies an attempt out under mu, reaps, reports and signals on the copy
  // without it, and merges the result back under mu (MergeAttempt); the control thread is the only
  // one that adds attempts or reaps workers (DrainNow joins it first), so a merge loses nothing.
  // Lock order: persist_mu, then mu.
  mutable absl::Mutex mu;
  std::map<std::string, LocalAttempt> local ABSL_GUARDED_BY(mu);  // key: "<job>#<attempt>"
  bool drained ABSL_GUARDED_BY(mu) = false;  // Drain or Detach ran
  // Serializes writes of workers.state, so an older snapshot never overwrites a newer one.
  absl::Mutex persist_mu ABSL_ACQUIRED_BEFORE(mu);
  // Serializes claiming the devices of unreleased attempts (ClaimHeldDevices) with releasing them
  // (SuperviseAttempt deletes the claims and marks the attempt released in `local` under it), so
  // a claim is never written after the release that should have deleted it. Held across store
  // calls; never with mu held (it is taken before mu).
  absl::Mutex claims_mu ABSL_ACQUIRED_BEFORE(mu);

  // ---- Control thread only (Schedule, Supervise; DrainNow's last Supervise runs after the join).
  Scheduler scheduler;  // placement, restart, node-loss and retention decisions (scheduler.h)
  // The kernel's OOM-kill count at the previous Supervise pass (-1 = not read yet), and when it
  // last rose: a worker reaped with SIGKILL soon after was killed by the OOM killer.
  std::map<std::string, Standby> standbys;  // key "<job>#<attempt they wait for>"
  int64_t oom_kills_seen = -1;
  absl::Time last_oom_kill = absl::InfinitePast();
  absl::Time last_replica_sweep = absl::InfinitePast();

  // daemon.cc: start-up, the loops, registration, drain and detach.
  absl::Status Init();
  void ControlLoop() ABSL_LOCKS_EXCLUDED(mu);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu);
  // Writes this node's record under the current lease, through `via` (the main client, or the
  // lease keeper's).
  absl::Status Register(store::Client* via) ABSL_LOCKS_EXCLUDED(mu);
  void Tick() ABSL_LOCKS_EXCLUDED(mu);
  void DrainNow() ABSL_LOCKS_EXCLUDED(mu, persist_mu);
  void DetachNow() ABSL_LOCKS_EXCLUDED(mu, persist_mu);
  std::string JobDir(const std::string& job) const;
  // In-memory replicas (fault_tolerance.replicas: memory; runtime/worker/replicas.h): this
  // daemon's directory of them, /dev/shm/ember-<uid>/<hash of work_root and node>, one
  // subdirectory per job (the workers' EMBER_REPLICA_DIR). SweepReplicas (supervise.cc, every few
  // seconds) removes the subdirectory of every job that is not active with an attempt here, so a
  // job's files go when it ends, and a daemon restarted after a crash removes what its predecessor
  // left on its first sweep. A drain (DrainNow) removes the whole root; a detach keeps it.
  std::string ReplicaRoot() const;
  // FNV-1a of "<work_root>|<node>" (16 hex digits): stable across restarts, distinct per daemon
  // on one machine (ReplicaRoot, the cgroup directory's name).
  std::string InstanceHash() const;
  // Init, after LoadState: opens `cgroups` per opts.process_cgroup (one log line says which
  // mechanism ends the attempts' process trees) and kills and removes the groups of attempts
  // that are not in `local` (a predecessor's, or warm standbys it did not persist). An error only
  // for an explicitly configured parent that cannot be used.
  absl::Status SetUpCgroups() ABSL_LOCKS_EXCLUDED(mu);
  // Kills and removes the cgroup of (job, attempt) when cgroups are in use; the number of
  // processes it held (0 without cgroups or on failure, which is logged).
  int KillAttemptCgroup(const std::string& job, int attempt);
  void SweepReplicas(const std::map<std::string, Job>& records) ABSL_LOCKS_EXCLUDED(mu);

  // lease.cc (lease thread): keeps the node lease alive on a connection of its own, redialled
  // after each failed try; a lost node (lease_policy.h: expired, credentials refused, or lease_ttl
  // gone by since the last acknowledged refresh) stops this node's attempts ("node lost: <node>")
  // and registers the node again once the store takes its calls.
  void LeaseLoop() ABSL_LOCKS_EXCLUDED(mu, persist_mu, claims_mu);
  // SIGTERMs every unreleased local attempt with `why` and marks its stop key pending.
  void StopForLostLease(const std::string& why, const absl::Status& cause) ABSL_LOCKS_EXCLUDED(mu);
  // Through `via`: the pending stop keys, the wait for the stopped workers, a new lease (the old
  // one revoked), the claims of devices still held, the node record.
  absl::Status RegisterAgain(store::Client* via, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu, persist_mu, claims_mu);
  // Claims (alloc keys under `lease_id`) every device of an unreleased local attempt: after a new
  // lease (the old one took its claims with it) the scheduler must still see them busy.
  absl::Status ClaimHeldDevices(store::Client* via, int64_t lease_id)
      ABSL_LOCKS_EXCLUDED(mu, claims_mu);
  // Waits until every local attempt is released (its workers reaped by the control loop, its
  // devices given back), at most kill_grace + 3 s. False when some attempt is still running.
  bool AwaitLocalReleased() ABSL_LOCKS_EXCLUDED(mu);
  // How long one keeper try (dial, refresh) may take: lease_refresh, within [250 ms, 1 s].
  absl::Duration LeaseTryTimeout() const;

  // schedule.cc (leader only): reads the store into snapshots, asks `scheduler`, writes the
  // outcome. Never takes mu.
  void Schedule() ABSL_LOCKS_EXCLUDED(mu);
  // A RUNNING job's current attempt: success, or a failure (stop key, then RESTARTING or FAILED).
  void CheckAttempt(const Job& job, const std::set<std::string>& alive) ABSL_LOCKS_EXCLUDED(mu);
  // Retention (at most every 2 s): forgets finished jobs per keep_finished_jobs and
  // finished_job_ttl (JobsToForget).
  void ForgetFinished() ABSL_LOCKS_EXCLUDED(mu);

  // supervise.cc (every node, control thread).
  void Supervise() ABSL_LOCKS_EXCLUDED(mu, persist_mu, claims_mu);
  // Starts this node's ranks of `job`'s current attempt unless its stop key is set, adds the
  // attempt to `local` (stopping it at once when the node began draining meanwhile), persists.
  void StartPlaced(const Job& job) ABSL_LOCKS_EXCLUDED(mu, persist_mu);
  // Prepares the job directory and forks this node's ranks of the current attempt; nullopt when
  // none are placed here. An exec failure is reported to the store as exit code 127.
  std::optional<LocalAttempt> SpawnAttempt(const Job& job) ABSL_LOCKS_EXCLUDED(mu);
  // One supervision pass over `a` (a copy taken under mu): reaps and reports exits, stops the
  // attempt on a failure or its stop key, SIGKILLs after kill_grace, releases the devices when
  // every rank ended. True when something workers.state records changed.
  bool SuperviseAttempt(LocalAttempt* a, const std::map<std::string, Job>& records,
                        bool oom_recent) ABSL_LOCKS_EXCLUDED(mu, claims_mu);
  // SIGTERMs the attempt's live workers (once). `a` is the caller's: a copy, or an entry of
  // `local` with mu held.
  void StopAttempt(LocalAttempt* a, const std::string& reason);
  // Non-blocking: true when `w` has ended (exit_code/signal set; for an adopted non-child the
  // status comes from the worker's own worker_exit/<rank> key, else "unknown").
  bool Reap(const LocalAttempt& a, LocalWorker* w, std::string* note) ABSL_LOCKS_EXCLUDED(mu);
  // Merges what a pass learned on a copy into `local` (exits, stopping, released).
  void MergeAttempt(const LocalAttempt& from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The job's directories for `attempt` (0750), through job_files.h: the job directory,
  // checkpoints/ and flight/attempt-<n>/ belong to `runs_as` when set (a script run as
  // script_user); logs/ and uploads/ stay the daemon's (group runs_as->gid, so the script reads
  // its uploads), and one a script replaced is moved aside and made afresh.
  absl::Status MakeJobDirs(const std::string& job, int attempt,
                           const std::optional<ScriptIdentity>& runs_as);
  // A rank's log (a path under opts.work_root/<job>/logs), opened for appending without following
  // any symlink, in a directory that must be the daemon's (job_files.h).
  absl::StatusOr<Fd> OpenRankLog(const std::string& log_path) const;
  // SIGKILLs every process left of the attempt's local ranks, found by their environment
  // (process.h KillAttemptProcesses): a rank's daemonised descendant does not outlive its job.
  void SweepAttempt(const LocalAttempt& a);
  // With opts.reap_orphans: reaps this process's children that are no rank or standby it knows
  // (orphans re-parented to it), SIGKILLing them first when `kill`. Control thread (or Drain after
  // it ended).
  void ReapOrphans(bool kill) ABSL_LOCKS_EXCLUDED(mu);

  // script_job.cc: script jobs (worker.script). Fills `so` (argv, environment, user) for one rank
  // of a script job; `master` is the attempt's TCPStore listener "host:port".
  struct ScriptLaunch {
    ScriptIdentity identity;
    std::string master_host;
    int master_port = 0;
  };
  // Decides the user and the listener of this node's ranks of the attempt: starts the listener
  // when this node runs rank 0 (and publishes it under keys::TorchMaster), else reads it.
  // UNAVAILABLE while another node's listener is not published yet (try again next pass); any
  // other error fails the node's ranks with it.
  absl::StatusOr<ScriptLaunch> PrepareScript(const Job& job, const jobs::v1::NodeAssignment& mine,
                                             const std::string& dir)
      ABSL_LOCKS_EXCLUDED(mu, torch_mu);
  void ScriptSpawnOptions(const Job& job, const jobs::v1::NodeAssignment& mine,
                          const ScriptLaunch& launch, const ember::job::WorkerEnv& we,
                          SpawnOptions* so) const;
  // Shuts the attempt's listener down (its clients see their connections closed); all of them
  // with an empty job.
  void StopTorchStore(const std::string& job, int attempt) ABSL_LOCKS_EXCLUDED(torch_mu);
  void StopTorchStores() ABSL_LOCKS_EXCLUDED(torch_mu);

  // standby.cc (control thread): starts attempt a.attempt+1's warm interpreters for this node's
  // ranks of `a` when the job wants them and `a` has run a few seconds; TakeStandby hands rank
  // w's interpreter its go file (so's environment and argv) and returns its pid, nullopt when none
  // waits; SuperviseStandbys reaps them and kills the unused (`all`: every one, for drain).
  void MaybeStartStandby(const Job& job, const LocalAttempt& a) ABSL_LOCKS_EXCLUDED(mu);
  std::optional<pid_t> TakeStandby(const std::string& job, int attempt, const LocalWorker& w,
                                   const SpawnOptions& so, const ScriptLaunch& launch);
  void SuperviseStandbys(const std::map<std::string, Job>& records,
                         const std::set<std::string>& started, bool all) ABSL_LOCKS_EXCLUDED(mu);

  // worker_state.cc: <state_dir>/workers.state.
  // Writes the lease and the unreleased attempts (snapshot under mu, write without it), atomically
  // and durably (base::WriteFileAtomic); a failure is logged.
  void Persist() ABSL_LOCKS_EXCLUDED(mu, persist_mu);
  std::string StateTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Reads workers.state (before the loops start): the lease to keep and the workers to re-attach
  // to (those whose pid still has the recorded start time).
  void LoadState() ABSL_LOCKS_EXCLUDED(mu);

  // records.cc: job records and nodes in the store (any thread, never under mu). ReadRecord
  // returns the job and the raw bytes for compare-and-set. The store is not trusted (whoever can
  // write a key could forge a record): an id that CheckJobId refuses is INVALID_ARGUMENT before it
  // names a key, and a record naming another id than its key's is DATA_LOSS (ParseRecord).
  absl::StatusOr<std::pair<Job, std::string>> ReadRecord(const std::string& id)
      ABSL_LOCKS_EXCLUDED(mu);
  // Logs, once per id (at most 1024 ids), a record that Schedule or Supervise skips because
  // ReadRecord refused it (not for a record that is merely gone or a store that did not answer).
  void WarnRefusedRecord(const std::string& id, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(refused_mu);
  absl::Mutex refused_mu;
  std::set<std::string> refused_records ABSL_GUARDED_BY(refused_mu);
  // Applies `mutate` to the record with compare-and-set, retrying on races. `mutate` returns
  // false to leave the record unchanged.
  absl::StatusOr<Job> UpdateRecord(const std::string& id, const std::function<bool(Job*)>& mutate)
      ABSL_LOCKS_EXCLUDED(mu);
  absl::StatusOr<std::vector<jobs::v1::Node>> ReadNodes() ABSL_LOCKS_EXCLUDED(mu);
  // "node/device" -> job
  absl::StatusOr<std::map<std::string, std::string>> ReadAllocs() ABSL_LOCKS_EXCLUDED(mu);
  void FillProgress(Job* job) ABSL_LOCKS_EXCLUDED(mu);

  // http.cc: the HTTP endpoint and /metrics (metrics.h). Started by Init when http_listen is set.
  absl::Status StartHttp();
  // What /metrics shows now: node, this node's ranks (under mu), and on the scheduler every job
  // record (store reads, without mu).
  MetricsSnapshot TakeSnapshot() ABSL_LOCKS_EXCLUDED(mu);
  base::HttpResponse ServeMetrics(const base::HttpRequest& req) ABSL_LOCKS_EXCLUDED(mu);

  // Self-synchronized; created in the constructor (schedule.cc and supervise.cc count into it).
  std::unique_ptr<MetricsExporter> metrics;
  // The last rendered /metrics body, reused for scrapes within a second of it.
  absl::Mutex scrape_mu;
  std::string scrape_text ABSL_GUARDED_BY(scrape_mu);
  absl::Time scrape_at ABSL_GUARDED_BY(scrape_mu) = absl::InfinitePast();
  // Declared last, so destroyed first: its handlers use the members above. Null when off.
  std::unique_ptr<base::HttpServer> http;
};

int64_t NowMs();

// supervise.cc: the host part of the daemon's advertised address, which its workers advertise to
// their peers ("" for a wildcard or an IPv6 literal: the comm default, 127.0.0.1).
std::string CommHostOf(const std::string& advertise);
// GLOO_SOCKET_IFNAME for a script job's ranks: the interface holding `comm_host` (CommHostOf), ""
// for loopback, "" or an address no local interface has (script_job.cc).
std::string GlooInterfaceOf(const std::string& comm_host);

// records.cc: the job record `raw` read from under key id `id`: CheckJobId(id), a parsable Job,
// and job.id() == id (else DATA_LOSS: a forged record must not steer the daemon to another job's
// keys or directory).
absl::StatusOr<Job> ParseRecord(const std::string& id, const std::string& raw);

// service.cc
std::unique_ptr<grpc::Service> MakeJobsService(Daemon::Impl* d);
std::unique_ptr<grpc::Service> MakeNodesService(Daemon::Impl* d);
// Job records under active/ (or every listed one), newest submission first (List; the job page).
absl::StatusOr<std::vector<Job>> ListJobs(Daemon::Impl* d, bool active_only);
// <job dir>/metrics/rank-<rank>.jsonl on this node.
std::string RankMetricsPath(Daemon::Impl* d, const std::string& job, int rank);
// `metric` of every rank of `job` (GetSeries; the job page's JSON): attempt < 0 = every attempt,
// max_points 0 = 1000. INVALID_ARGUMENT for an unknown metric or max_points out of range.
absl::Status ReadSeries(Daemon::Impl* d, const Job& job, const std::string& metric,
                        int max_points, int attempt, jobs::v1::Series* out);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_DAEMON_IMPL_H_
