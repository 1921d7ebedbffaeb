#include "runtime/daemon/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/placement.h"
#include "runtime/daemon/process.h"
#include "runtime/job/env.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

namespace fs = std::filesystem;
using jobs::v1::RankExit;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

bool IsTerminal(JobState s) {
  return s == jobs::v1::SUCCEEDED || s == jobs::v1::FAILED || s == jobs::v1::CANCELLED;
}

std::string NoRetryReason(const Job& job) {
  const int n = job.attempts_size();
  if (n == 0) return "";
  const jobs::v1::Attempt& cur = job.attempts(n - 1);
  if (!cur.has_root_cause()) return "";  // node lost, or stopped from outside: always retryable
  const RankExit& c = cur.root_cause();
  if (c.signal() == 0 && c.exit_code() == 2) {
    return "exit code 2 is a bad spec or environment: not retried";
  }
  if (n < 2) return "";
  const jobs::v1::Attempt& prev = job.attempts(n - 2);
  if (!prev.has_root_cause()) return "";
  const RankExit& p = prev.root_cause();
  if (p.rank() == c.rank() && p.exit_code() == c.exit_code() && p.signal() == c.signal() &&
      cur.last_step() <= prev.last_step()) {
    return absl::StrCat("failed the same way as attempt ", prev.number(),
                        " without getting past step ", prev.last_step(),
                        ": a spec or code error is not retried");
  }
  return "";
}

JobState NextStateAfterFailure(const Job& job) {
  if (job.attempts_size() > job.spec().max_restarts()) return jobs::v1::FAILED;
  if (!NoRetryReason(job).empty()) return jobs::v1::FAILED;
  return jobs::v1::RESTARTING;
}

absl::Duration RestartBackoff(int next_attempt, absl::Duration initial, absl::Duration max) {
  absl::Duration d = initial;
  for (int i = 1; i < next_attempt && d < max; ++i) d *= 2;
  return std::min(d, max);
}

std::vector<std::string> JobsToForget(const std::vector<Job>& finished, int keep,
                                      absl::Duration ttl, int64_t now_ms) {
  auto end = [](const Job& j) { return j.end_unix_ms() > 0 ? j.end_unix_ms() : j.submit_unix_ms(); };
  std::vector<const Job*> order;
  for (const Job& j : finished) order.push_back(&j);
  std::sort(order.begin(), order.end(), [&](const Job* a, const Job* b) {
    return end(*a) != end(*b) ? end(*a) > end(*b) : a->id() > b->id();
  });
  std::vector<std::string> out;
  const int64_t ttl_ms = absl::ToInt64Milliseconds(ttl);
  for (size_t i = 0; i < order.size(); ++i) {
    const bool too_many = keep > 0 && i >= static_cast<size_t>(keep);
    const bool too_old = ttl_ms > 0 && now_ms - end(*order[i]) > ttl_ms;
    if (too_many || too_old) out.push_back(order[i]->id());
  }
  return out;
}

std::string DescribeExit(const RankExit& e) {
  std::string where = absl::StrCat("rank ", e.rank(), e.node().empty() ? "" : " on ", e.node());
  if (e.oom_killed()) {
    return absl::StrCat(where, " ran out of memory: killed by the kernel's OOM killer (signal ",
                        e.signal(), "); lower batch_size, the model size or ranks per node");
  }
  if (e.signal() != 0) {
    const char* name = sigabbrev_np(e.signal());
    return absl::StrCat(where, " was killed by signal ", e.signal(),
                        name ? absl::StrCat(" (SIG", name, ")") : "");
  }
  if (e.exit_code() == 75) return absl::StrCat(where, " stopped on request (exit code 75)");
  return absl::StrCat(where, " exited with code ", e.exit_code());
}

namespace {

// A job directory (0750 whatever the umask). Failures surface when the worker uses it.
void MakeJobDir(const std::string& d) {
  std::error_code ec;
  fs::create_directories(d, ec);
  ::chmod(d.c_str(), 0750);
}

// A file of the job directory, 0640; never follows a symlink at `path`.
void WriteJobFile(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
  if (fd < 0) {
    spdlog::error("cannot write {}: {}", path, strerror(errno));
    return;
  }
  ::fchmod(fd, 0640);
  for (size_t off = 0; off < data.size();) {
    ssize_t w = ::write(fd, data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      spdlog::error("cannot write {}: {}", path, strerror(errno));
      break;
    }
    off += static_cast<size_t>(w);
  }
  ::close(fd);
}

// A hang is noticed by a healthy rank whose collective timed out, so the first failure names that
// rank, not the one that hung. True when the analyzer's first finding is that other ranks (not
// `failed_rank`) never joined the op: that finding is the root cause and leads the reason.
bool NamesHungRanks(const std::string& verdict, int failed_rank) {
  const std::string first = verdict.substr(0, verdict.find("; "));
  const size_t at = first.find(" never joined ");
  if (at == std::string::npos) return false;
  absl::string_view who(first.data(), at);  // "rank 1" or "ranks 1, 3"
  if (!absl::ConsumePrefix(&who, "ranks ") && !absl::ConsumePrefix(&who, "rank ")) return false;
  for (absl::string_view r : absl::StrSplit(who, ", ")) {
    int v = -1;
    if (!absl::SimpleAtoi(r, &v) || v == failed_rank) return false;
  }
  return true;
}

}  // namespace

std::string Daemon::Impl::JobDir(const std::string& job) const {
  return absl::StrCat(opts.work_root, "/", job);
}

// ------------------------------------------------------------------------------------------------
// Store helpers

absl::StatusOr<std::pair<Job, std::string>> Daemon::Impl::ReadRecord(const std::string& id) {
  ASSIGN_OR_RETURN(std::string raw, store->Get(keys::Record(id)));
  Job job;
  if (!job.ParseFromString(raw)) return absl::DataLossError("job record " + id + " is corrupt");
  return std::make_pair(std::move(job), std::move(raw));
}

absl::StatusOr<Job> Daemon::Impl::UpdateRecord(const std::string& id,
                                               const std::function<bool(Job*)>& mutate) {
  for (int tries = 0; tries < 50; ++tries) {
    ASSIGN_OR_RETURN(auto rec, ReadRecord(id));
    Job job = rec.first;
    if (!mutate(&job)) return rec.first;
    ASSIGN_OR_RETURN(store::CompareSetResult r,
                     store->CompareSet(keys::Record(id), rec.second, job.SerializeAsString()));
    if (r.swapped) return job;
  }
  return absl::AbortedError("job record " + id + " kept changing; try again");
}

absl::StatusOr<std::vector<jobs::v1::Node>> Daemon::Impl::ReadNodes() {
  ASSIGN_OR_RETURN(std::vector<std::string> names, store->ListKeys("nodes/"));
  ASSIGN_OR_RETURN(auto values, store->MultiGet(names));
  std::vector<jobs::v1::Node> out;
  for (const auto& v : values) {
    jobs::v1::Node n;
    if (v && n.ParseFromString(*v)) out.push_back(std::move(n));
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> Daemon::Impl::ReadAllocs() {
  ASSIGN_OR_RETURN(std::vector<std::string> names, store->ListKeys("alloc/"));
  ASSIGN_OR_RETURN(auto values, store->MultiGet(names));
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (values[i]) out[names[i].substr(strlen("alloc/"))] = *values[i];
  }
  return out;
}

void Daemon::Impl::FillProgress(Job* job) {
  if (job->attempts_size() == 0) return;
  int n = job->attempts(job->attempts_size() - 1).number();
  auto v = store->Get(keys::Progress(job->id(), n, 0));
  if (!v.ok()) return;
  if (!job->mutable_progress()->ParseFromString(*v)) job->clear_progress();
}

// ------------------------------------------------------------------------------------------------
// Start-up and registration

absl::Status Daemon::Impl::Init() {
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
  co.credentials = opts.tls.enabled() ? channel_creds : nullptr;
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

  LoadState();  // the lease to keep and the workers to re-attach to
  RETURN_IF_ERROR(Register());
  last_tick_ms = NowMs();
  control_thread = std::thread([this] { ControlLoop(); });
  heartbeat_thread = std::thread([this] { HeartbeatLoop(); });
  spdlog::info("emberd {} ready: api {}, store {}{}, work root {}, auth {}", opts.node_name,
               advertise, store_addr, opts.host_store ? " (hosted)" : "", opts.work_root,
               opts.auth_token.empty() ? "OFF" : "token");
  return absl::OkStatus();
}

absl::Status Daemon::Impl::Register() {
  int64_t id = lease.load();
  if (id == 0 || !store->RefreshLease(id).ok()) {
    ASSIGN_OR_RETURN(id, store->GrantLease(opts.lease_ttl));
    lease = id;
  }
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
  RETURN_IF_ERROR(store->SetWithLease(keys::Node(opts.node_name), node.SerializeAsString(), id));
  last_heartbeat_ms = NowMs();
  return absl::OkStatus();
}

void Daemon::Impl::HeartbeatLoop() {
  while (!stop.WaitForNotificationWithTimeout(opts.heartbeat)) {
    absl::Status s = Register();
    if (!s.ok()) spdlog::warn("heartbeat to the store failed: {}", s.ToString());
    absl::MutexLock l(&mu);
    for (const auto& [k, a] : local) {
      for (const auto& w : a.workers) {
        if (!w.exited) RotateIfLarger(w.log_path, opts.log_max_bytes, opts.log_keep);
      }
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
// Scheduling (leader only)

std::vector<NodeDevices> Snapshot(const std::vector<jobs::v1::Node>& nodes,
                                  const std::map<std::string, std::string>& allocs) {
  std::vector<NodeDevices> out;
  for (const auto& n : nodes) {
    NodeDevices nd;
    nd.name = n.name();
    nd.address = n.address();
    nd.draining = n.draining();
    for (const auto& d : n.devices()) {
      nd.devices.push_back(d.id());
      if (allocs.count(absl::StrCat(n.name(), "/", d.id()))) nd.busy.insert(d.id());
    }
    out.push_back(std::move(nd));
  }
  return out;
}

GangRequest RequestOf(const Job& job) {
  return GangRequest{job.world_size(), job.spec().resources().nodes(),
                     job.spec().resources().devices_per_node()};
}

void Daemon::Impl::Schedule() {
  auto active = store->ListKeys("active/");
  if (!active.ok()) return;
  std::vector<Job> jobs;
  for (const std::string& k : *active) {
    auto rec = ReadRecord(k.substr(strlen("active/")));
    if (rec.ok()) jobs.push_back(rec->first);
  }
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) {
    return a.submit_unix_ms() != b.submit_unix_ms() ? a.submit_unix_ms() < b.submit_unix_ms()
                                                    : a.id() < b.id();
  });
  auto nodes = ReadNodes();
  auto allocs = ReadAllocs();
  if (!nodes.ok() || !allocs.ok()) return;
  std::set<std::string> alive;
  for (const auto& n : *nodes) alive.insert(n.name());
  std::set<std::string> jobs_holding;
  for (const auto& [dev, job] : *allocs) jobs_holding.insert(job);

  // Running and finished jobs first; the queue (PENDING, RESTARTING) in FIFO order after.
  std::vector<QueuedJob> queue;
  std::map<std::string, const Job*> queued;
  for (const Job& job : jobs) {
    const std::string& id = job.id();
    if (job.state() == jobs::v1::PENDING || job.state() == jobs::v1::RESTARTING) {
      QueuedJob q{id, job.device_type(), RequestOf(job)};
      // Not yet: the previous attempt's devices are not released, or the restart backs off.
      // Either way the job keeps its place (and its reservation) in the queue.
      q.startable = !jobs_holding.count(id) &&
                    !(job.state() == jobs::v1::RESTARTING && job.attempts_size() > 0 &&
                      NowMs() < job.attempts(job.attempts_size() - 1).restart_unix_ms());
      queue.push_back(std::move(q));
      queued[id] = &job;
    } else if (job.state() == jobs::v1::RUNNING) {
      CheckAttempt(job, alive);
    } else if (IsTerminal(job.state()) && !jobs_holding.count(id)) {
      (void)store->Delete(keys::Active(id));  // finished and every device given back
    }
  }

  for (const QueueDecision& d : PlanQueue(queue, Snapshot(*nodes, *allocs))) {
    const std::string& id = d.id;
    const Job& job = *queued[id];
    if (!d.placement) {
      // Say why it waits (PENDING only: a RESTARTING job keeps its failure and restart reason).
      if (job.state() == jobs::v1::PENDING && !d.waiting.empty() && job.reason() != d.waiting) {
        (void)UpdateRecord(id, [&](Job* j) {
          if (j->state() != jobs::v1::PENDING || j->reason() == d.waiting) return false;
          j->set_reason(d.waiting);
          return true;
        });
      }
      continue;
    }
    const jobs::v1::Assignment& placed = *d.placement;
    // Claim the devices under each node's lease (they vanish with a lost node), then flip the
    // record; on a lost race give them back.
    std::vector<std::string> claimed;
    bool ok = true;
    for (const auto& na : placed.nodes()) {
      int64_t node_lease = 0;
      for (const auto& n : *nodes)
        if (n.name() == na.node()) node_lease = n.lease_id();
      for (const auto& dev : na.devices()) {
        std::string key = keys::Alloc(na.node(), dev);
        ok = ok && store->SetWithLease(key, id, node_lease).ok();
        claimed.push_back(key);
      }
    }
    int next_attempt = job.attempts_size();
    auto updated = ok ? UpdateRecord(id, [&](Job* j) {
      if (j->state() != jobs::v1::PENDING && j->state() != jobs::v1::RESTARTING) return false;
      j->set_state(jobs::v1::RUNNING);
      j->set_reason("");
      jobs::v1::Attempt* a = j->add_attempts();
      a->set_number(next_attempt);
      *a->mutable_assignment() = placed;
      a->set_start_unix_ms(NowMs());
      return true;
    }) : absl::StatusOr<Job>(absl::UnavailableError("alloc failed"));
    if (!updated.ok() || updated->state() != jobs::v1::RUNNING) {
      for (const auto& k : claimed) (void)store->Delete(k);
      continue;
    }
    std::vector<std::string> where;
    for (const auto& na : placed.nodes())
      where.push_back(absl::StrCat(na.node(), "[", absl::StrJoin(na.devices(), ","), "]"));
    spdlog::info("placed {} attempt {}: {}", id, next_attempt, absl::StrJoin(where, " "));
  }
  ForgetFinished();
}

void Daemon::Impl::ForgetFinished() {
  if (opts.keep_finished_jobs <= 0 && opts.finished_job_ttl <= absl::ZeroDuration()) return;
  if (absl::Now() - last_retention < absl::Seconds(2)) return;
  last_retention = absl::Now();
  auto listed = store->ListKeys("joblist/");
  auto active = store->ListKeys("active/");
  if (!listed.ok() || !active.ok()) return;
  std::set<std::string> running;
  for (const std::string& k : *active) running.insert(k.substr(strlen("active/")));
  std::vector<std::string> record_keys;
  for (const std::string& k : *listed) {
    std::string id = k.substr(strlen("joblist/"));
    if (!running.count(id)) record_keys.push_back(keys::Record(id));
  }
  auto records = store->MultiGet(record_keys);
  if (!records.ok()) return;
  std::vector<Job> finished;
  for (const auto& v : *records) {
    Job j;
    if (v && j.ParseFromString(*v) && IsTerminal(j.state())) finished.push_back(std::move(j));
  }
  const std::vector<std::string> forget =
      JobsToForget(finished, opts.keep_finished_jobs, opts.finished_job_ttl, NowMs());
  for (const std::string& id : forget) {
    for (const Job& j : finished) {
      if (j.id() == id && !j.submission_id().empty()) {
        (void)store->Delete(keys::Submission(j.submission_id()));
      }
    }
    (void)store->Delete(keys::JobList(id));  // first: a listing never shows a half-deleted job
    auto n = store->DeletePrefix(absl::StrCat("jobs/", id, "/"));
    spdlog::info("retention: forgot finished job {} ({} store keys)", id, n.ok() ? *n : -1);
  }
}

void Daemon::Impl::CheckAttempt(const Job& job, const std::set<std::string>& alive) {
  const std::string& id = job.id();
  const jobs::v1::Attempt& at = job.attempts(job.attempts_size() - 1);
  const int n = at.number();
  auto failure = store->Get(keys::Failure(id, n));
  std::string lost;
  std::set<int> ranks_on_live_nodes;
  for (const auto& na : at.assignment().nodes()) {
    if (!alive.count(na.node())) {
      lost = na.node();
      continue;
    }
    for (int i = 0; i < na.devices_size(); ++i) ranks_on_live_nodes.insert(na.first_rank() + i);
  }
  std::vector<std::string> exit_keys;
  for (int r = 0; r < job.world_size(); ++r) exit_keys.push_back(keys::Exit(id, n, r));
  auto exits = store->MultiGet(exit_keys);
  if (!exits.ok()) return;
  bool all = true, all_zero = true, settled = true;
  RankExit first_bad;
  for (int r = 0; r < job.world_size(); ++r) {
    const auto& v = (*exits)[r];
    if (!v) {
      all = false;
      if (ranks_on_live_nodes.count(r)) settled = false;
      continue;
    }
    RankExit e;
    e.ParseFromString(*v);
    if (e.exit_code() != 0 || e.signal() != 0) {
      if (all_zero) first_bad = e;
      all_zero = false;
    }
  }
  RankExit cause;
  bool has_cause = false;
  std::string reason;
  // The first decision wins: a rank's own failure, else whatever already set the stop key (a
  // draining node, an earlier pass that saw the node lost), else a lost node, else a bad exit.
  auto stop = store->Get(keys::Stop(id, n));
  if (failure.ok() && cause.ParseFromString(*failure)) {
    reason = DescribeExit(cause);
    has_cause = true;
  } else if (stop.ok() && !stop->empty()) {
    reason = *stop;
  } else if (!lost.empty()) {
    reason = "node lost: " + lost;
  } else if (all && !all_zero) {
    cause = first_bad;
    has_cause = true;
    reason = DescribeExit(cause);
  }
  const std::string key = absl::StrCat(id, "#", n);
  if (reason.empty()) {
    failing_since.erase(key);
    if (!all) return;
    auto r = UpdateRecord(id, [&](Job* j) {
      if (j->state() != jobs::v1::RUNNING || j->attempts_size() != job.attempts_size()) return false;
      j->set_state(jobs::v1::SUCCEEDED);
      j->mutable_attempts(j->attempts_size() - 1)->set_end_unix_ms(NowMs());
      j->set_end_unix_ms(NowMs());
      return true;
    });
    if (r.ok()) spdlog::info("job {} succeeded", id);
    return;
  }
  // Stop every rank now (they poll this key); decide once they have all reported (their flight
  // recorders are dumped before they exit), or after failure_settle.
  auto [it, first_seen] = failing_since.emplace(key, absl::Now());
  if (first_seen && !stop.ok()) {
    (void)store->CompareSet(keys::Stop(id, n), std::nullopt, reason);
    spdlog::warn("job {} attempt {}: {}; stopping every rank", id, n, reason);
  }
  if (!settled && absl::Now() - it->second < opts.failure_settle) return;
  failing_since.erase(it);

  const std::string fr_dir = absl::StrCat(JobDir(id), "/flight/attempt-", n);
  std::string verdict;
  if (opts.analyze_flight) verdict = opts.analyze_flight(fr_dir);
  // The failing rank's own last step (other ranks race on to a later step before they stop).
  int64_t last_step = 0;
  if (auto v = store->Get(keys::Progress(id, n, has_cause ? cause.rank() : 0)); v.ok()) {
    jobs::v1::Progress p;
    if (p.ParseFromString(*v)) last_step = p.step();
  }
  const bool hang = NamesHungRanks(verdict, has_cause ? cause.rank() : -1);
  std::string full = verdict.empty() ? reason
                     : hang ? absl::StrCat(verdict, " (flight recorder; noticed first: ", reason, ")")
                            : absl::StrCat(reason, "; flight recorder: ", verdict);
  auto r = UpdateRecord(id, [&](Job* j) {
    if (j->state() != jobs::v1::RUNNING || j->attempts_size() != job.attempts_size()) return false;
    auto* a = j->mutable_attempts(j->attempts_size() - 1);
    a->set_reason(full);
    a->set_verdict(verdict);
    a->set_last_step(last_step);
    if (has_cause) {
      *a->mutable_root_cause() = cause;
      *j->mutable_root_cause() = cause;
    }
    a->set_end_unix_ms(NowMs());
    const JobState next = NextStateAfterFailure(*j);
    j->set_state(next);
    std::string why = full;
    if (next == jobs::v1::FAILED) {
      std::string no_retry = NoRetryReason(*j);
      if (!no_retry.empty()) {
        absl::StrAppend(&why, " (", no_retry, ")");
      } else if (j->spec().max_restarts() > 0) {
        absl::StrAppend(&why, " (after ", j->attempts_size(), " attempts; max_restarts ",
                        j->spec().max_restarts(), ")");
      }
      j->set_end_unix_ms(NowMs());
    } else {
      const absl::Duration wait = RestartBackoff(j->attempts_size(), opts.restart_backoff,
                                                 opts.restart_backoff_max);
      a->set_restart_unix_ms(NowMs() + absl::ToInt64Milliseconds(wait));
      absl::StrAppend(&why, " (restarting as attempt ", j->attempts_size(), " in ",
                      absl::FormatDuration(wait), ")");
    }
    j->set_reason(why);
    return true;
  });
  if (r.ok()) {
    spdlog::warn("job {} attempt {} failed: {} -> {}", id, n, r->reason(),
                 jobs::v1::JobState_Name(r->state()));
  }
}

// ------------------------------------------------------------------------------------------------
// Supervision (every node)

void Daemon::Impl::SpawnAttempt(const Job& job) {
  const jobs::v1::Attempt& at = job.attempts(job.attempts_size() - 1);
  const jobs::v1::NodeAssignment* mine = nullptr;
  for (const auto& na : at.assignment().nodes())
    if (na.node() == opts.node_name) mine = &na;
  if (mine == nullptr) return;
  LocalAttempt la;
  la.job = job.id();
  la.attempt = at.number();
  la.devices.assign(mine->devices().begin(), mine->devices().end());
  std::string key = absl::StrCat(job.id(), "#", at.number());

  std::string dir = JobDir(job.id());
  // Files the daemon writes (job.yaml) and the user's uploads live apart: uploads go under
  // uploads/, so no upload can replace the validated spec. Directories 0750, files 0640
  // (docs/operations.md, "File permissions").
  const std::string uploads = dir + "/uploads";
  std::string fr_dir = absl::StrCat(dir, "/flight/attempt-", at.number());
  for (const std::string& d : {dir, dir + "/logs", dir + "/checkpoints", dir + "/flight", fr_dir, uploads}) {
    MakeJobDir(d);
  }
  if (!fs::exists(dir + "/job.yaml")) {
    auto spec = store->Get(keys::SpecYaml(job.id()));
    if (spec.ok()) WriteJobFile(dir + "/job.yaml", *spec);
    const std::string prefix = keys::FilesPrefix(job.id());
    auto names = store->ListKeys(prefix);
    if (names.ok()) {
      for (const std::string& k : *names) {
        auto v = store->Get(k);
        const std::string rel = k.substr(prefix.size());  // CheckUploadName: no "..", no leading "/"
        for (size_t i = rel.find('/'); i != std::string::npos; i = rel.find('/', i + 1)) {
          MakeJobDir(absl::StrCat(uploads, "/", rel.substr(0, i)));
        }
        if (v.ok()) WriteJobFile(absl::StrCat(uploads, "/", rel), *v);
      }
    }
  }
  const int local_world = mine->devices_size();
  for (int i = 0; i < local_world; ++i) {
    LocalWorker w;
    w.rank = mine->first_rank() + i;
    w.local_rank = i;
    w.device = mine->devices(i);
    w.log_path = absl::StrCat(dir, "/logs/rank-", w.rank, ".log");
    SpawnOptions so;
    so.argv = {opts.worker_binary};
    so.cwd = dir;
    so.log_path = w.log_path;
    so.die_with_parent = opts.workers_die_with_daemon;  // forked on the control thread
    so.header = absl::StrCat("=== ember: attempt ", at.number(), " rank ", w.rank, " on ",
                             opts.node_name, " device ", w.device, " ===");
    std::string dev = DeviceOfKind(w.device, "cuda") ? w.device : "cpu";
    ember::job::WorkerEnv we;  // the worker's environment (runtime/job/env.h)
    we.store_addr = store_addr;
    we.job_id = job.id();
    we.attempt = at.number();
    we.rank = w.rank;
    we.world_size = at.assignment().world_size();
    we.local_rank = i;
    we.local_world_size = local_world;
    we.node_rank = mine->node_rank();
    we.device = dev;
    we.job_dir = dir;
    we.fr_dump_dir = fr_dir;
    we.upload_dir = uploads;
    if (!opts.auth_token.empty()) we.auth_token_file = token_file;
    // Workers dial the store as this daemon does: its CA, and its certificate for mTLS (paths
    // only; the key stays in its file).
    we.tls.ca_file = opts.tls.ca_file;
    if (!opts.tls.cert_file.empty()) {
      we.tls.cert_file = opts.tls.cert_file;
      we.tls.key_file = opts.tls.key_file;
    }
    so.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}};
    for (auto& kv : we.ToEnv()) so.env.push_back(std::move(kv));
    for (const char* pass : {"HOME", "LANG", "TZ", "LD_LIBRARY_PATH", "TMPDIR"}) {
      if (const char* v = getenv(pass)) so.env.push_back({pass, v});
    }
    for (const auto& kv : opts.worker_env) so.env.push_back(kv);
    auto pid = SpawnWorker(so);
    if (!pid.ok()) {
      spdlog::error("job {} rank {}: {}", job.id(), w.rank, pid.status().ToString());
      w.exited = true;
      w.exit_code = 127;
      RankExit e;
      e.set_rank(w.rank);
      e.set_node(opts.node_name);
      e.set_exit_code(127);
      e.add_last_log_lines(pid.status().ToString());
      e.set_unix_ms(NowMs());
      (void)store->Set(keys::Exit(job.id(), at.number(), w.rank), e.SerializeAsString());
      (void)store->CompareSet(keys::Failure(job.id(), at.number()), std::nullopt,
                              e.SerializeAsString());
    } else {
      w.pid = *pid;
      if (auto info = ReadProcInfo(w.pid)) w.start_ticks = info->start_ticks;
    }
    la.workers.push_back(w);
  }
  spdlog::info("job {} attempt {}: started ranks {}..{} on {}", job.id(), at.number(),
               mine->first_rank(), mine->first_rank() + local_world - 1, opts.node_name);
  local[key] = std::move(la);
  PersistLocked();
}

void Daemon::Impl::StopAttempt(LocalAttempt* a, const std::string& reason) {
  if (a->stopping) return;
  a->stopping = true;
  a->stop_reason = reason;
  a->term_sent = absl::Now();
  for (const auto& w : a->workers) {
    if (!w.exited) SignalGroup(w.pid, SIGTERM);
  }
  spdlog::info("job {} attempt {}: stopping local ranks ({})", a->job, a->attempt, reason);
}

void Daemon::Impl::PersistLocked() {
  // Re-attach state, read back by LoadState(). Written atomically and durably (temp file, fsync,
  // rename, fsync of the directory) so it is never half-written. Lines:
  //   lease <id>
  //   attempt <job> <n> <device,device,...>
  //   worker <job> <n> <rank> <local rank> <pid> <start ticks> <device> <exited> <code> <signal> <log>
  std::string text = "# ember daemon worker state v2\n";
  absl::StrAppend(&text, "lease ", lease.load(), "\n");
  for (const auto& [k, a] : local) {
    if (a.released) continue;
    absl::StrAppend(&text, "attempt ", a.job, " ", a.attempt, " ",
                    a.devices.empty() ? "-" : absl::StrJoin(a.devices, ","), "\n");
    for (const auto& w : a.workers) {
      absl::StrAppend(&text, "worker ", a.job, " ", a.attempt, " ", w.rank, " ", w.local_rank, " ",
                      w.pid, " ", w.start_ticks, " ", w.device, " ", w.exited ? 1 : 0, " ",
                      w.exit_code, " ", w.signal, " ", w.log_path, "\n");
    }
  }
  absl::Status s = base::WriteFileAtomic(opts.state_dir + "/workers.state", text);
  if (!s.ok()) {
    spdlog::error("cannot save the re-attach state: {} (a daemon restarted now would not find "
                  "its running workers)", s.ToString());
  }
}

void Daemon::Impl::LoadState() {
  std::ifstream f(opts.state_dir + "/workers.state");
  if (!f) return;
  std::string line;
  int adopted = 0, gone = 0;
  absl::MutexLock l(&mu);
  while (std::getline(f, line)) {
    std::vector<std::string> t = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (t.empty() || t[0][0] == '#') continue;
    if (t[0] == "lease" && t.size() == 2) {
      int64_t id = 0;
      if (absl::SimpleAtoi(t[1], &id)) lease = id;
    } else if (t[0] == "attempt" && t.size() == 4) {
      int n = 0;
      if (!absl::SimpleAtoi(t[2], &n)) continue;
      LocalAttempt& a = local[absl::StrCat(t[1], "#", n)];
      a.job = t[1];
      a.attempt = n;
      if (t[3] != "-") a.devices = absl::StrSplit(t[3], ',');
    } else if (t[0] == "worker" && t.size() == 12) {
      int n = 0;
      if (!absl::SimpleAtoi(t[2], &n)) continue;
      auto it = local.find(absl::StrCat(t[1], "#", n));
      if (it == local.end()) continue;
      LocalWorker w;
      bool ok = absl::SimpleAtoi(t[3], &w.rank) && absl::SimpleAtoi(t[4], &w.local_rank) &&
                absl::SimpleAtoi(t[5], &w.pid) && absl::SimpleAtoi(t[6], &w.start_ticks) &&
                absl::SimpleAtoi(t[9], &w.exit_code) && absl::SimpleAtoi(t[10], &w.signal);
      if (!ok) continue;
      w.device = t[7];
      w.exited = t[8] == "1";
      w.log_path = t[11];
      w.adopted = true;
      if (!w.exited) ++(ProcessAlive(w.pid, w.start_ticks) ? adopted : gone);
      it->second.workers.push_back(w);
    }
  }
  if (adopted + gone > 0) {
    spdlog::info("re-attached to {} running worker(s) from {}/workers.state ({} ended while no "
                 "daemon watched; reported on the first pass)",
                 adopted, opts.state_dir, gone);
  }
}

bool Daemon::Impl::Reap(const LocalAttempt& a, LocalWorker* w, std::string* note) {
  if (!w->adopted) return TryReap(w->pid, &w->exit_code, &w->signal);
  // A re-attached worker may still be our child (a daemon restarted inside one process).
  int r = TryReapChild(w->pid, &w->exit_code, &w->signal);
  if (r == 1) return true;
  if (r == 0) return false;
  if (ProcessAlive(w->pid, w->start_ticks)) return false;
  // Not our child and gone: the worker leaves its own exit status in the store.
  auto v = store->Get(keys::WorkerExit(a.job, a.attempt, w->rank));
  w->signal = 0;
  jobs::v1::WorkerExit we;
  if (v.ok() && we.ParseFromString(*v)) {
    w->exit_code = we.exit_code();
    return true;
  }
  w->exit_code = -1;
  *note = "ember: exit status unknown (the worker ended while its daemon was restarting, or was "
          "killed)";
  return true;
}

void Daemon::Impl::Supervise() {
  // 1. Start what the scheduler placed here.
  auto active = store->ListKeys("active/");
  std::map<std::string, Job> records;
  if (active.ok()) {
    for (const std::string& k : *active) {
      std::string id = k.substr(strlen("active/"));
      auto rec = ReadRecord(id);
      if (rec.ok()) records[id] = rec->first;
    }
  }
  absl::MutexLock l(&mu);
  for (const auto& [id, job] : records) {
    if (job.state() != jobs::v1::RUNNING || job.attempts_size() == 0 || draining) continue;
    int n = job.attempts(job.attempts_size() - 1).number();
    if (local.count(absl::StrCat(id, "#", n))) continue;
    // Never start an attempt that was already told to stop.
    if (store->Get(keys::Stop(id, n)).ok()) continue;
    SpawnAttempt(job);
  }
  // 2. Reap, report, stop.
  const int64_t oom_now = ReadOomKillCount();
  if (oom_kills_seen >= 0 && oom_now > oom_kills_seen) last_oom_kill = absl::Now();
  oom_kills_seen = oom_now;
  // An OOM victim may take a while to exit (its memory is torn down first), so a SIGKILL reaped
  // within a second of a rise of the count is taken as that kill.
  const bool oom_recent = absl::Now() - last_oom_kill < absl::Seconds(1);
  bool changed = false;
  for (auto& [key, a] : local) {
    if (a.released) continue;
    for (auto& w : a.workers) {
      if (w.exited) continue;
      std::string note;
      if (!Reap(a, &w, &note)) continue;
      w.exited = true;
      changed = true;
      RankExit e;
      e.set_rank(w.rank);
      e.set_node(opts.node_name);
      e.set_exit_code(w.exit_code);
      e.set_signal(w.signal);
      e.set_pid(w.pid);
      e.set_unix_ms(NowMs());
      // Another process OOM-killed within that second would be mistaken for this kill.
      e.set_oom_killed(w.signal == SIGKILL && !a.stopping && oom_recent);
      bool failed = w.exit_code != 0 || w.signal != 0;
      if (failed) {
        for (auto& line : TailLines(w.log_path, opts.last_log_lines)) e.add_last_log_lines(line);
        if (!note.empty()) e.add_last_log_lines(note);
      }
      (void)store->Set(keys::Exit(a.job, a.attempt, w.rank), e.SerializeAsString());
      // A rank that fails on its own (not one we stopped, not one that obeyed the stop key with
      // exit code 75) is a root-cause candidate; the first writer of the failure key wins across
      // every node.
      const bool obeyed_stop = w.signal == 0 && w.exit_code == 75;
      if (failed && !a.stopping && !obeyed_stop && !store->Get(keys::Stop(a.job, a.attempt)).ok()) {
        auto r = store->CompareSet(keys::Failure(a.job, a.attempt), std::nullopt,
                                   e.SerializeAsString());
        if (r.ok() && r->swapped) {
          spdlog::warn("job {} attempt {}: {}", a.job, a.attempt, DescribeExit(e));
          (void)store->Set(keys::Stop(a.job, a.attempt), DescribeExit(e));
        }
        StopAttempt(&a, DescribeExit(e));
      }
    }
    bool all_exited = std::all_of(a.workers.begin(), a.workers.end(),
                                  [](const LocalWorker& w) { return w.exited; });
    if (!a.stopping && !all_exited) {
      auto it = records.find(a.job);
      bool terminal = it == records.end() ? true : IsTerminal(it->second.state());
      auto stop_key = store->Get(keys::Stop(a.job, a.attempt));
      if (stop_key.ok()) StopAttempt(&a, *stop_key);
      else if (terminal && it != records.end()) StopAttempt(&a, "job ended");
    }
    if (a.stopping && !all_exited && absl::Now() - a.term_sent > opts.kill_grace) {
      for (const auto& w : a.workers) {
        if (!w.exited) SignalGroup(w.pid, SIGKILL);
      }
    }
    if (all_exited) {
      // Sweep stragglers of the groups (a worker's own children), then give the devices back.
      for (const auto& w : a.workers) SignalGroup(w.pid, SIGKILL);
      for (const auto& d : a.devices) (void)store->Delete(keys::Alloc(opts.node_name, d));
      a.released = true;
      changed = true;
      spdlog::info("job {} attempt {}: local ranks done, devices released", a.job, a.attempt);
    }
  }
  if (changed) PersistLocked();
}

void Daemon::Impl::DrainNow() {
  {
    absl::MutexLock l(&mu);
    if (drained) return;
    drained = true;
  }
  draining = true;
  spdlog::info("emberd {} draining", opts.node_name);
  (void)Register();  // tell the scheduler: no new placements here
  {
    absl::MutexLock l(&mu);
    for (auto& [k, a] : local) {
      if (a.released) continue;
      // The gang is broken: every rank of the attempt, on every node, stops.
      const std::string why = "node " + opts.node_name + " draining";
      (void)store->CompareSet(keys::Stop(a.job, a.attempt), std::nullopt, why);
      StopAttempt(&a, why);
    }
  }
  // Let the control loop reap and report; wait for it (bounded by kill_grace + margin).
  absl::Time deadline = absl::Now() + opts.kill_grace + absl::Seconds(3);
  while (absl::Now() < deadline) {
    {
      absl::MutexLock l(&mu);
      bool all = true;
      for (const auto& [k, a] : local) all = all && a.released;
      if (all) break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  stop.Notify();
  if (control_thread.joinable()) control_thread.join();
  if (heartbeat_thread.joinable()) heartbeat_thread.join();
  Supervise();  // a last reap (SIGKILLs anything left) with the loops stopped
  {
    absl::MutexLock l(&mu);
    for (auto& [k, a] : local) {
      for (auto& w : a.workers) {
        if (w.exited) continue;
        SignalGroup(w.pid, SIGKILL);
        for (int i = 0; i < 200 && !TryReap(w.pid, &w.exit_code, &w.signal); ++i) {
          absl::SleepFor(absl::Milliseconds(5));
        }
        w.exited = true;
      }
    }
    PersistLocked();
  }
  if (leader) (void)store->Delete(keys::kLeader);
  if (lease.load() != 0) (void)store->RevokeLease(lease.load());
  if (server.server) server.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
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
  {
    absl::MutexLock l(&mu);
    PersistLocked();
  }
  // The lease, the leader key and the device claims stay: they expire after lease_ttl unless the
  // next daemon refreshes the lease.
  if (server.server) server.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (hosted_store) hosted_store->Shutdown();
}

// ------------------------------------------------------------------------------------------------
// Daemon

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() { Drain(); }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  absl::Status s = impl->Init();
  if (!s.ok()) {
    impl->stop.Notify();
    if (impl->control_thread.joinable()) impl->control_thread.join();
    if (impl->heartbeat_thread.joinable()) impl->heartbeat_thread.join();
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
