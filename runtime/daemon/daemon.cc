// The daemon's wiring: start-up, registration under the node lease, the control loop (election,
// Schedule on the leader, Supervise everywhere) and the heartbeat loop, drain and detach, and the
// public Daemon methods. The lease thread (keeping the lease alive) lives in lease.cc. The decisions live in scheduler.h and placement.h; their execution in
// schedule.cc; workers in supervise.cc; workers.state in worker_state.cc; job records in records.cc.
#include "runtime/daemon/daemon.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/job_page.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/process.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

namespace fs = std::filesystem;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

namespace {

SchedulerOptions SchedulerOptionsOf(const DaemonOptions& o) {
  SchedulerOptions s;
  s.restart_backoff = o.restart_backoff;
  s.restart_backoff_max = o.restart_backoff_max;
  s.failure_settle = o.failure_settle;
  s.keep_finished_jobs = o.keep_finished_jobs;
  s.finished_job_ttl = o.finished_job_ttl;
  return s;
}

}  // namespace

Daemon::Impl::Impl(DaemonOptions o)
    : opts(std::move(o)), clock(base::RealClock()), scheduler(SchedulerOptionsOf(opts), clock),
      metrics(std::make_unique<MetricsExporter>(opts.metrics)) {}

std::string Daemon::Impl::JobDir(const std::string& job) const {
  return absl::StrCat(opts.work_root, "/", job);
}

std::string Daemon::Impl::InstanceHash() const {
  uint64_t h = 1469598103934665603ull;
  for (char c : absl::StrCat(opts.work_root, "|", opts.node_name)) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return absl::StrCat(absl::Hex(h, absl::kZeroPad16));
}

std::string Daemon::Impl::ReplicaRoot() const {
  return absl::StrCat("/dev/shm/ember-", geteuid(), "/", InstanceHash());
}

absl::Status Daemon::Impl::SetUpCgroups() {
  const std::string& want = opts.process_cgroup;
  if (want == "off") {
    spdlog::info("process trees of attempts: ended by the sweep by environment (process_cgroup: "
                 "off); a descendant that clears its environment escapes it");
    return absl::OkStatus();
  }
  if (want != "auto" && (want.empty() || want[0] != '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "process_cgroup: '", want, "' is neither auto, off nor an absolute cgroup v2 directory"));
  }
  ProcessCgroupsOptions co;
  co.parent = want == "auto" ? "" : want;
  co.name = absl::StrCat("emberd-", InstanceHash());
  auto cg = ProcessCgroups::Open(co);
  if (!cg.ok()) {
    if (want != "auto") return base::Annotate(cg.status(), "process_cgroup");
    spdlog::info("process trees of attempts: ended by the sweep by environment (no usable cgroup "
                 "v2: {}); a descendant that clears its environment escapes it",
                 cg.status().ToString());
    return absl::OkStatus();
  }
  cgroups = std::move(*cg);
  spdlog::info("process trees of attempts: one {} group per attempt, killed at its end (and the "
               "sweep by environment)", cgroups->Describe());
  std::set<std::string> keep;
  {
    absl::MutexLock l(&mu);
    for (const auto& [k, a] : local) {
      if (!a.released) keep.insert(ProcessCgroups::LeafName(a.job, a.attempt));
    }
  }
  for (const std::string& leaf : cgroups->Leaves()) {
    if (keep.count(leaf)) continue;
    int killed = 0;
    absl::Status s = cgroups->KillAndRemove(leaf, &killed);
    if (!s.ok()) spdlog::warn("stale cgroup {}: {}", leaf, s.ToString());
    else spdlog::info("removed the stale cgroup {}/{} (killed {} process(es))", cgroups->dir(), leaf, killed);
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------------
// Start-up and registration

absl::Status Daemon::Impl::Init() {
  if (opts.reap_orphans && ::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return absl::InternalError(absl::StrCat("prctl(PR_SET_CHILD_SUBREAPER): ", strerror(errno)));
  }
  if (opts.node_name.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    opts.node_name = host;
  }
  if (opts.work_root.empty()) return absl::InvalidArgumentError("work_root: required");
  if (opts.worker_binary.empty()) return absl::InvalidArgumentError("worker_binary: required");
  if (::access(opts.worker_binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker_binary: ", opts.worker_binary, " is not an executable file"));
  }
  opts.worker_binary = fs::absolute(opts.worker_binary).string();  // workers start in the job dir
  opts.work_root = fs::absolute(opts.work_root).string();
  if (opts.state_dir.empty()) {
    opts.state_dir = absl::StrCat(opts.work_root, "/.emberd/", opts.node_name);
  }
  RETURN_IF_ERROR(base::MakeDirs(opts.work_root, 0777));  // the umask decides, as for mkdir -p
  RETURN_IF_ERROR(base::MakeDirs(opts.state_dir, 0777));  // then 0700, below
  ::chmod(opts.state_dir.c_str(), 0700);

  inventory = std::make_unique<Inventory>(opts.inventory);

  // Workers start in their job directory: hand them absolute paths.
  for (std::string* f : {&opts.tls.cert_file, &opts.tls.key_file, &opts.tls.ca_file}) {
    if (!f->empty()) *f = fs::absolute(*f).string();
  }
  ASSIGN_OR_RETURN(auto channel_creds, base::MakeChannelCredentials(opts.tls));
  ASSIGN_OR_RETURN(auto server_creds, base::MakeServerCredentials(opts.tls));
  if (opts.host_store) {
    store::StoreServerOptions so;
    so.address = opts.store_listen;
    so.auth_token = opts.auth_token;
    // TLS turns the store's plaintext fast path off (server.h).
    so.credentials = opts.tls.enabled() ? server_creds : nullptr;
    so.backend.data_dir = opts.store_data_dir;
    so.make_backend = opts.store_backend;
    ASSIGN_OR_RETURN(hosted_store, store::StoreServer::Start(so));
    store_addr = hosted_store->address();
  } else {
    if (opts.store_address.empty()) {
      return absl::InvalidArgumentError("store_address: required without --host-store");
    }
    store_addr = opts.store_address;
  }
  store::ClientOptions co;
  co.address = store_addr;
  co.auth_token = opts.auth_token;
  store_credentials = opts.tls.enabled() ? channel_creds : nullptr;
  co.credentials = store_credentials;
  co.default_timeout = absl::Seconds(10);
  co.connect_timeout = absl::Seconds(10);
  auto client = store::Client::Connect(co);
  if (!client.ok()) {
    return base::Annotate(client.status(), absl::StrCat("connecting to the store at ", store_addr));
  }
  store = *client;

  token_file = opts.state_dir + "/worker-token";
  if (!opts.auth_token.empty()) RETURN_IF_ERROR(base::WriteTokenFile(token_file, opts.auth_token));

  jobs_service = MakeJobsService(this);
  nodes_service = MakeNodesService(this);
  base::GrpcServerOptions go;
  go.address = opts.listen;
  go.auth_token = opts.auth_token;  // calls with it protect their connection (base/grpc_server.h)
  go.credentials = server_creds;
  ASSIGN_OR_RETURN(server, base::StartGrpcServer(go, {jobs_service.get(), nodes_service.get()}));
  advertise = opts.advertise.empty() ? server.address : opts.advertise;

  if (!opts.http_listen.empty()) {
    RETURN_IF_ERROR(StartHttp());
    RegisterJobPage(http.get(), this, opts.job_page_open);
    spdlog::info("job page at http://{}/jobs/{}", http->address(),
                 opts.job_page_open ? " (readable without login)" : "");
  }
  LoadState();  // the lease to keep and the workers to re-attach to
  RETURN_IF_ERROR(SetUpCgroups());  // before the control thread forks anything
  if (opts.lease_refresh <= absl::ZeroDuration()) {
    opts.lease_refresh = std::min(opts.heartbeat, opts.lease_ttl / 10);
  }
  if (lease.load() == 0 || !store->RefreshLease(lease.load()).ok()) {
    ASSIGN_OR_RETURN(int64_t id, store->GrantLease(opts.lease_ttl));
    lease = id;
  }
  // Re-attached workers keep their devices: claimed again before the node record shows them (a
  // lease that expired while no daemon ran took their claims, and the scheduler would place a new
  // attempt on them while they run; lease.cc does the same after a lost lease).
  RETURN_IF_ERROR(ClaimHeldDevices(&*store, lease.load()));
  RETURN_IF_ERROR(Register(&*store));
  last_tick_ms = NowMs();
  control_thread = std::thread([this] { ControlLoop(); });
  heartbeat_thread = std::thread([this] { HeartbeatLoop(); });
  lease_thread = std::thread([this] { LeaseLoop(); });
  spdlog::info("emberd {} ready: api {}, http {}, store {}{}, work root {}, auth {}",
               opts.node_name, advertise, http ? http->address() : "off", store_addr,
               !opts.host_store ? ""
               : opts.store_backend_name.empty()
                   ? std::string(" (hosted)")
                   : absl::StrCat(" (hosted, ", opts.store_backend_name, ")"),
               opts.work_root,
               opts.auth_token.empty() ? "OFF" : "token");
  return absl::OkStatus();
}

absl::Status Daemon::Impl::Register(store::Client* via) {
  // The lease thread refreshes the lease and replaces a lost one (lease.cc).
  const int64_t id = lease.load();
  jobs::v1::Node node;
  node.set_name(opts.node_name);
  node.set_address(advertise);
  node.set_healthy(!draining);
  node.set_draining(draining);
  node.set_heartbeat_unix_ms(NowMs());
  node.set_lease_id(id);
  node.set_version("ember 0.1");
  node.set_workers(0);
  inventory->Fill(&node);
  {
    absl::MutexLock l(&mu);
    int n = 0;
    for (const auto& [k, a] : local)
      for (const auto& w : a.workers) n += w.exited ? 0 : 1;
    node.set_workers(n);
  }
  const absl::Time t0 = absl::Now();
  absl::Status set = via->SetWithLease(keys::Node(opts.node_name), node.SerializeAsString(), id);
  metrics->ObserveStoreOp("heartbeat", absl::ToDoubleSeconds(absl::Now() - t0));
  RETURN_IF_ERROR(set);
  last_heartbeat_ms = NowMs();
  return absl::OkStatus();
}

void Daemon::Impl::HeartbeatLoop() {
  std::set<std::string> not_rotated;  // logs whose directory is not the daemon's (warned once)
  while (!stop.WaitForNotificationWithTimeout(opts.heartbeat)) {
    // A lost node: the lease thread registers it again (lease.cc).
    absl::Status s = lease_lost ? absl::OkStatus() : Register(&*store);
    // NOT_FOUND: the lease expired; the lease thread registers again under a new one.
    if (!s.ok() && !absl::IsNotFound(s)) {
      spdlog::warn("heartbeat to the store failed: {}", s.ToString());
    }
    std::vector<std::string> logs;
    {
      absl::MutexLock l(&mu);
      for (const auto& [k, a] : local) {
        for (const auto& w : a.workers) {
          if (!w.exited) logs.push_back(w.log_path);
        }
      }
    }
    // Through the daemon's own logs/ directory, never by path (job_files.h).
    for (const std::string& log : logs) {
      const std::string rel = RelativeTo(opts.work_root, log);
      const size_t slash = rel.rfind('/');
      if (slash == std::string::npos) continue;
      auto dir = OpenDirBelow(opts.work_root, rel.substr(0, slash), /*create=*/false, /*own=*/true);
      if (!dir.ok()) {
        if (not_rotated.insert(log).second) {  // once per log, not every heartbeat
          spdlog::warn("not rotating {}: {}", log, std::string(dir.status().message()));
        }
        continue;
      }
      RotateLogIfLarger(dir->get(), rel.substr(slash + 1), opts.log_max_bytes, opts.log_keep);
    }
  }
}

void Daemon::Impl::ControlLoop() {
  while (!stop.WaitForNotificationWithTimeout(opts.poll)) {
    Tick();
    last_tick_ms = NowMs();
  }
}

void Daemon::Impl::Tick() {
  if (opts.scheduler && !draining) {
    auto cur = store->Get(keys::kLeader);
    if (cur.ok()) {
      leader = (*cur == opts.node_name);
    } else if (absl::IsNotFound(cur.status())) {
      auto r = store->CompareSet(std::string(keys::kLeader), std::nullopt, opts.node_name);
      if (r.ok() && r->swapped &&
          store->SetWithLease(keys::kLeader, opts.node_name, lease.load()).ok()) {
        spdlog::info("{} is now the scheduler", opts.node_name);
        leader = true;
      }
    }
    if (leader) Schedule();
  }
  Supervise();
}

// ------------------------------------------------------------------------------------------------
// Drain and detach

void Daemon::Impl::DrainNow() {
  {
    absl::MutexLock l(&mu);
    if (drained) return;
    drained = true;
  }
  draining = true;  // from here StartPlaced stops what it starts (supervise.cc)
  spdlog::info("emberd {} draining", opts.node_name);
  (void)Register(&*store);  // tell the scheduler: no new placements here
  // The gang is broken: every rank of each attempt, on every node, stops.
  const std::string why = "node " + opts.node_name + " draining";
  std::vector<std::pair<std::string, int>> running;
  {
    absl::MutexLock l(&mu);
    for (const auto& [k, a] : local) {
      if (!a.released) running.emplace_back(a.job, a.attempt);
    }
  }
  for (const auto& [job, n] : running) {
    (void)store->CompareSet(keys::Stop(job, n), std::nullopt, why);
  }
  {
    absl::MutexLock l(&mu);
    for (auto& [k, a] : local) {
      if (!a.released) StopAttempt(&a, why);
    }
  }
  (void)AwaitLocalReleased();  // the control loop reaps and reports
  // This node's in-memory replicas serve only ranks restarted here; a drained daemon runs none.
  std::error_code ec;
  const auto n = std::filesystem::remove_all(ReplicaRoot(), ec);
  if (n > 0) spdlog::info("emberd {}: removed {} ({} in-memory replica entries)", opts.node_name, ReplicaRoot(), n);
  stop.Notify();
  if (control_thread.joinable()) control_thread.join();
  if (heartbeat_thread.joinable()) heartbeat_thread.join();
  if (lease_thread.joinable()) lease_thread.join();
  Supervise();  // a last reap (SIGKILLs anything left) with the loops stopped
  SuperviseStandbys({}, {}, /*all=*/true);
  ReapOrphans(/*kill=*/true);
  // Kill and reap whatever is left, on a copy: the waits happen without the lock.
  std::vector<LocalAttempt> left;
  {
    absl::MutexLock l(&mu);
    for (const auto& [k, a] : local) left.push_back(a);
  }
  for (LocalAttempt& a : left) {
    bool killed = false;
    for (auto& w : a.workers) {
      if (w.exited) continue;
      SignalGroup(w.pid, SIGKILL);
      for (int i = 0; i < 200 && !TryReap(w.pid, &w.exit_code, &w.signal); ++i) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      w.exited = true;
      killed = true;
    }
    if (killed) SweepAttempt(a);  // what the ranks left outside their groups (supervise.cc)
  }
  {
    absl::MutexLock l(&mu);
    for (const LocalAttempt& a : left) MergeAttempt(a);
  }
  if (cgroups) {  // every attempt here has ended: no group is needed any more
    if (absl::Status s = cgroups->RemoveAll(); !s.ok()) {
      spdlog::warn("emberd {}: removing its cgroups: {}", opts.node_name, s.ToString());
    }
  }
  Persist();
  if (leader) (void)store->Delete(keys::kLeader);
  if (lease.load() != 0) (void)store->RevokeLease(lease.load());
  http.reset();  // waits for in-flight page and /metrics requests
  if (server.server) server.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  StopTorchStores();  // before the backend they borrow
  if (hosted_store) hosted_store->Shutdown();
}

void Daemon::Impl::DetachNow() {
  {
    absl::MutexLock l(&mu);
    if (drained) return;
    drained = true;
  }
  spdlog::info("emberd {} detaching: workers keep running; a restarted daemon re-attaches",
               opts.node_name);
  stop.Notify();
  if (control_thread.joinable()) control_thread.join();
  if (heartbeat_thread.joinable()) heartbeat_thread.join();
  if (lease_thread.joinable()) lease_thread.join();
  SuperviseStandbys({}, {}, /*all=*/true);  // not persisted: a new daemon would not know them
  // The daemon's cgroup directory stays while attempts run in it (the next daemon takes it over).
  if (cgroups) (void)cgroups->RemoveIfEmpty();
  Persist();
  // The lease, the leader key and the device claims stay: they expire after lease_ttl unless the
  // next daemon refreshes the lease.
  http.reset();  // waits for in-flight page and /metrics requests
  if (server.server) server.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  StopTorchStores();  // before the backend they borrow
  if (hosted_store) hosted_store->Shutdown();
}

// ------------------------------------------------------------------------------------------------
// Daemon

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

bool Daemon::Impl::AwaitLocalReleased() {
  const absl::Time deadline = absl::Now() + opts.kill_grace + absl::Seconds(3);
  while (true) {
    {
      absl::MutexLock l(&mu);
      bool all = true;
      for (const auto& [k, a] : local) all = all && a.released;
      if (all) return true;
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

Daemon::~Daemon() { Drain(); }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  absl::Status s = impl->Init();
  if (!s.ok()) {
    impl->stop.Notify();
    if (impl->control_thread.joinable()) impl->control_thread.join();
    if (impl->heartbeat_thread.joinable()) impl->heartbeat_thread.join();
    if (impl->lease_thread.joinable()) impl->lease_thread.join();
    return s;
  }
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

std::string Daemon::address() const { return impl_->advertise; }
int Daemon::port() const { return impl_->server.port; }
std::string Daemon::store_address() const { return impl_->store_addr; }
const std::string& Daemon::node_name() const { return impl_->opts.node_name; }
void Daemon::Drain() { impl_->DrainNow(); }
void Daemon::Detach() { impl_->DetachNow(); }

bool Daemon::Healthy() const {
  int64_t now = NowMs();
  int64_t slack = 3 * absl::ToInt64Milliseconds(impl_->opts.heartbeat) + 2000;
  return now - impl_->last_tick_ms < slack && now - impl_->last_heartbeat_ms < slack;
}

std::string Daemon::http_address() const { return impl_->http ? impl_->http->address() : ""; }
base::HttpServer* Daemon::http_server() const { return impl_->http.get(); }

int Daemon::NumWorkers() const {
  absl::MutexLock l(&impl_->mu);
  int n = 0;
  for (const auto& [k, a] : impl_->local)
    for (const auto& w : a.workers) n += w.exited ? 0 : 1;
  return n;
}

std::string Daemon::StatusLine() const {
  absl::MutexLock l(&impl_->mu);
  int jobs = 0, workers = 0;
  for (const auto& [k, a] : impl_->local) {
    if (a.released) continue;
    ++jobs;
    for (const auto& w : a.workers) workers += w.exited ? 0 : 1;
  }
  return absl::StrCat(jobs, " job(s), ", workers, " worker(s)", impl_->leader ? ", scheduler" : "",
                      impl_->draining ? ", draining" : "");
}

}  // namespace ember::daemon
