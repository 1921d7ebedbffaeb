// Supervision (every node, on the control thread): starts the ranks the scheduler placed on this
// node, reaps them, reports their exits to the store, stops attempts and gives devices back.
// The lock rule (daemon_impl.h): mu is held only to copy attempts out of `local` and to merge the
// results back; forks, store calls, waits and file writes happen on the copies without it.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/auth.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/env_knobs.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/placement.h"
#include "runtime/daemon/process.h"
#include "runtime/job/env.h"
#include "runtime/jobspec/spec.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

using jobs::v1::RankExit;

namespace {

// A directory descriptor, closed with its owner.
class DirFd {
 public:
  DirFd() = default;
  explicit DirFd(int fd) : fd_(fd) {}
  DirFd(DirFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  DirFd& operator=(DirFd&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  DirFd(const DirFd&) = delete;
  DirFd& operator=(const DirFd&) = delete;
  ~DirFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// Directory `name` (one path component, never "" "." or "..") under `parent`, created when
// missing, 0750 whatever the umask. Never through a symlink: O_NOFOLLOW|O_DIRECTORY refuses a
// symlink (or anything but a directory) at `name`, so nothing outside `parent` is created or
// chmod'ed. `shown` names it in errors.
absl::StatusOr<DirFd> OpenDirAt(int parent, const std::string& name, const std::string& shown) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", shown, "' is not a plain directory name"));
  }
  if (::mkdirat(parent, name.c_str(), 0750) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", shown, ": ", strerror(errno)));
  }
  DirFd fd(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    const bool link = errno == ELOOP || errno == ENOTDIR;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open ", shown, ": ", strerror(errno),
        link ? " (it is a symlink or not a directory; emberd never follows one: remove it)" : ""));
  }
  ::fchmod(fd.get(), 0750);  // a directory inside the job directory (or the job directory itself)
  return fd;
}

// File `name` of directory `dir`, 0640, written whole under a unique temporary name
// (O_CREAT|O_EXCL|O_NOFOLLOW) and renamed to `name` (which replaces a symlink there, never
// follows it): daemons sharing the work root may write the same file while another's workers
// read it, and a reader sees the old file or the whole new one. `shown` names it in errors.
absl::Status WriteFileAt(int dir, const std::string& name, const std::string& data,
                         const std::string& shown) {
  std::string tmp;
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 8; ++tries) {
    tmp = absl::StrCat(name, ".tmp.", base::GenerateToken().substr(0, 10));
    fd = ::openat(dir, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", shown, ": ", strerror(errno)));
  ::fchmod(fd, 0640);
  absl::Status st;
  for (size_t off = 0; off < data.size();) {
    ssize_t w = ::write(fd, data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      st = absl::InternalError(absl::StrCat("cannot write ", shown, ": ", strerror(errno)));
      break;
    }
    off += static_cast<size_t>(w);
  }
  ::close(fd);
  if (st.ok() && ::renameat(dir, tmp.c_str(), dir, name.c_str()) != 0) {
    st = absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", shown, ": ", strerror(errno)));
  }
  if (!st.ok()) ::unlinkat(dir, tmp.c_str(), 0);
  return st;
}

// The job's files from the store: its uploads under `uploads`, then the spec as job.yaml in the
// job directory `job`, written only when every upload is in place (on a shared work root its
// presence tells other daemons the files are complete, and they do not fetch them again). The
// first failure, with job.yaml not written. The store is not trusted: every upload name is
// checked (CheckUploadName) before anything is written, and each is written by openat under the
// uploads directory, one component at a time, never through a symlink or "..".
absl::Status FetchJobFiles(store::Client& store, const std::string& job_id, int job, int uploads,
                           const std::string& dir) {
  auto spec = store.Get(keys::SpecYaml(job_id));
  if (!spec.ok()) return base::Annotate(spec.status(), "reading the job's spec");
  const std::string prefix = keys::FilesPrefix(job_id);
  auto names = store.ListKeys(prefix);
  if (!names.ok()) return base::Annotate(names.status(), "listing the job's uploads");
  for (const std::string& k : *names) {
    RETURN_IF_ERROR(base::Annotate(CheckUploadName(k.substr(prefix.size())),
                                   "an upload in the store (refused; nothing written)"));
  }
  for (const std::string& k : *names) {
    const std::string rel = k.substr(prefix.size());
    auto v = store.Get(k);
    if (!v.ok()) return base::Annotate(v.status(), absl::StrCat("reading upload '", rel, "'"));
    std::vector<std::string> parts = absl::StrSplit(rel, '/');
    const std::string leaf = parts.back();
    parts.pop_back();
    DirFd owned;
    int at = uploads;
    std::string shown = dir + "/uploads";
    for (const std::string& p : parts) {
      shown = absl::StrCat(shown, "/", p);
      auto sub = OpenDirAt(at, p, shown);
      if (!sub.ok()) return base::Annotate(sub.status(), absl::StrCat("writing upload '", rel, "'"));
      owned = std::move(*sub);
      at = owned.get();
    }
    RETURN_IF_ERROR(base::Annotate(WriteFileAt(at, leaf, *v, absl::StrCat(dir, "/uploads/", rel)),
                                   absl::StrCat("writing upload '", rel, "'")));
  }
  return WriteFileAt(job, "job.yaml", *spec, dir + "/job.yaml");
}

// The job directory <work_root>/<id> and its subdirectories (logs, checkpoints,
// flight/attempt-<n>, uploads), each 0750,
// created without following a symlink (OpenDirAt) and without touching the work root's mode.
// Returns the job directory and its uploads/ directory.
struct JobDirs {
  DirFd job, uploads;
};
absl::StatusOr<JobDirs> MakeJobDirs(const std::string& work_root, const std::string& id,
                                    int attempt) {
  RETURN_IF_ERROR(CheckJobId(id));  // ReadRecord checked it; a directory name must never be ".."
  const std::string dir = absl::StrCat(work_root, "/", id);
  DirFd root(::open(work_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (root.get() < 0) {
    return absl::InternalError(absl::StrCat("cannot open the work root ", work_root, ": ", strerror(errno)));
  }
  JobDirs out;
  ASSIGN_OR_RETURN(out.job, OpenDirAt(root.get(), id, dir));
  for (const char* sub : {"logs", "checkpoints"}) {
    RETURN_IF_ERROR(OpenDirAt(out.job.get(), sub, absl::StrCat(dir, "/", sub)).status());
  }
  ASSIGN_OR_RETURN(DirFd flight, OpenDirAt(out.job.get(), "flight", dir + "/flight"));
  const std::string fr = absl::StrCat("attempt-", attempt);
  RETURN_IF_ERROR(OpenDirAt(flight.get(), fr, absl::StrCat(dir, "/flight/", fr)).status());
  ASSIGN_OR_RETURN(out.uploads, OpenDirAt(out.job.get(), "uploads", dir + "/uploads"));
  return out;
}

}  // namespace

// The host part of the daemon's advertised address, which its workers advertise to their peers
// for TCP (EMBER_COMM_HOST; without it a worker advertises 127.0.0.1, unreachable from other
// hosts). "" for a wildcard or an IPv6 literal (the comm layer's TCP is IPv4): the comm default.
std::string CommHostOf(const std::string& advertise) {
  const size_t colon = advertise.rfind(':');
  std::string host = colon == std::string::npos ? advertise : advertise.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host.find(':') != std::string::npos ||
      host.find('[') != std::string::npos) {
    return "";
  }
  return host;
}

std::optional<LocalAttempt> Daemon::Impl::SpawnAttempt(const Job& job) {
  const jobs::v1::Attempt& at = job.attempts(job.attempts_size() - 1);
  const jobs::v1::NodeAssignment* mine = nullptr;
  for (const auto& na : at.assignment().nodes())
    if (na.node() == opts.node_name) mine = &na;
  if (mine == nullptr) return std::nullopt;
  LocalAttempt la;
  la.job = job.id();
  la.attempt = at.number();
  la.started = clock->Now();
  la.devices.assign(mine->devices().begin(), mine->devices().end());

  std::string dir = JobDir(job.id());
  // Files the daemon writes (job.yaml) and the user's uploads live apart: uploads go under
  // uploads/, so no upload can replace the validated spec. Directories 0750, files 0640
  // (docs/operations.md, "File permissions"). The record came from the store, which is not
  // trusted: its id was checked (ReadRecord), the directories are created under the work root
  // without following a symlink, and the spec's paths are checked against this node's policy.
  const std::string uploads = dir + "/uploads";
  std::string fr_dir = absl::StrCat(dir, "/flight/attempt-", at.number());
  absl::Status start_error = CheckSpecPaths(job.spec(), opts.data_roots);
  if (start_error.ok() && spec::IsScriptJob(job.spec())) start_error = CheckScriptEnv(job.spec());
  start_error = base::Annotate(start_error, "the job's record in the store (refused by this node)");
  absl::StatusOr<JobDirs> dirs = absl::FailedPreconditionError("not made");
  if (start_error.ok()) {
    dirs = MakeJobDirs(opts.work_root, job.id(), at.number());
    start_error = dirs.status();
  }
  // job.yaml last: on a work root shared by several daemons its presence means the uploads are
  // all in place too (written first, it let another host start its workers while the uploads
  // were still being fetched from the store: seen with 10 ms RTT between the hosts).
  // A store that did not answer: the next pass tries again. Any other failure fails this node's
  // ranks with the reason, as a fork failure would (before, job.yaml was written anyway, and the
  // attempt ran without the upload; on a shared work root every later attempt did too).
  if (start_error.ok() &&
      ::faccessat(dirs->job.get(), "job.yaml", F_OK, AT_SYMLINK_NOFOLLOW) != 0) {
    absl::Status files =
        FetchJobFiles(*store, job.id(), dirs->job.get(), dirs->uploads.get(), dir);
    if (absl::IsUnavailable(files) || absl::IsDeadlineExceeded(files)) {
      spdlog::warn("job {} attempt {}: fetching its files failed ({}); trying again", job.id(),
                   at.number(), files.ToString());
      return std::nullopt;
    }
    start_error = base::Annotate(files, absl::StrCat("the job's files in ", dir));
  }
  // A script job: its user and its attempt's TCPStore listener first (script_job.cc). A failure
  // fails this node's ranks with the reason, as a fork failure would.
  std::optional<ScriptLaunch> script;
  if (start_error.ok() && spec::IsScriptJob(job.spec())) {
    auto prepared = PrepareScript(job, *mine, dir);
    if (prepared.ok()) {
      script = std::move(*prepared);
    } else if (absl::IsUnavailable(prepared.status()) && mine->first_rank() != 0) {
      return std::nullopt;  // rank 0's daemon has not published its listener yet: next pass
    } else {
      start_error = prepared.status();
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
    const std::string comm_host = CommHostOf(advertise);
    const bool host_set = std::any_of(opts.worker_env.begin(), opts.worker_env.end(),
                                      [](const auto& kv) { return kv.first == comm::kEnvHost; });
    if (!comm_host.empty() && !host_set) so.env.push_back({comm::kEnvHost, comm_host});
    for (const auto& kv : opts.worker_env) so.env.push_back(kv);
    std::optional<pid_t> warm;
    if (script) {
      ScriptSpawnOptions(job, *mine, *script, we, &so);
      warm = TakeStandby(job.id(), at.number(), w, so, *script);
    }
    auto pid = warm ? absl::StatusOr<pid_t>(*warm)
               : start_error.ok() ? SpawnWorker(so) : absl::StatusOr<pid_t>(start_error);
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
      metrics->CountWorkerStart();
      w.pid = *pid;
      if (auto info = ReadProcInfo(w.pid)) w.start_ticks = info->start_ticks;
    }
    la.workers.push_back(w);
  }
  spdlog::info("job {} attempt {}: started ranks {}..{} on {}", job.id(), at.number(),
               mine->first_rank(), mine->first_rank() + local_world - 1, opts.node_name);
  return la;
}

void Daemon::Impl::StopAttempt(LocalAttempt* a, const std::string& reason) {
  if (a->stopping) return;
  a->stopping = true;
  a->stop_reason = reason;
  a->term_sent = clock->Now();
  for (const auto& w : a->workers) {
    if (!w.exited) SignalGroup(w.pid, SIGTERM);
  }
  spdlog::info("job {} attempt {}: stopping local ranks ({})", a->job, a->attempt, reason);
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
      auto rec = ReadRecord(id);  // a forged id or record is refused (records.cc), never started
      if (rec.ok()) records[id] = rec->first;
      else WarnRefusedRecord(id, rec.status());
    }
  }
  std::vector<const Job*> placed;
  {
    absl::MutexLock l(&mu);
    for (const auto& [id, job] : records) {
      // A lost node starts nothing until it is registered again (lease.cc).
      if (job.state() != jobs::v1::RUNNING || job.attempts_size() == 0 || draining ||
          lease_lost) {
        continue;
      }
      int n = job.attempts(job.attempts_size() - 1).number();
      if (!local.count(absl::StrCat(id, "#", n))) placed.push_back(&job);
    }
  }
  for (const Job* job : placed) StartPlaced(*job);

  // 2. Reap, report, stop: on copies of the unreleased attempts, merged back after.
  const int64_t oom_now = ReadOomKillCount();
  if (oom_kills_seen >= 0 && oom_now > oom_kills_seen) last_oom_kill = clock->Now();
  oom_kills_seen = oom_now;
  // An OOM victim may take a while to exit (its memory is torn down first), so a SIGKILL reaped
  // within a second of a rise of the count is taken as that kill.
  const bool oom_recent = clock->Now() - last_oom_kill < absl::Seconds(1);
  std::vector<LocalAttempt> pass;
  {
    absl::MutexLock l(&mu);
    for (const auto& [key, a] : local) {
      if (!a.released) pass.push_back(a);
    }
  }
  bool changed = false;
  for (LocalAttempt& a : pass) changed = SuperviseAttempt(&a, records, oom_recent) || changed;
  std::set<std::string> started;
  {
    absl::MutexLock l(&mu);
    for (const LocalAttempt& a : pass) MergeAttempt(a);
    for (const auto& [key, a] : local) started.insert(key);
  }
  // 3. Script jobs' warm standbys for their next attempts (standby.cc).
  SuperviseStandbys(records, started, /*all=*/false);
  for (const LocalAttempt& a : pass) {
    auto it = records.find(a.job);
    if (it != records.end()) MaybeStartStandby(it->second, a);
  }
  if (changed) Persist();
}

void Daemon::Impl::StartPlaced(const Job& job) {
  const std::string& id = job.id();
  const int n = job.attempts(job.attempts_size() - 1).number();
  // Never start an attempt that was already told to stop.
  if (store->Get(keys::Stop(id, n)).ok()) return;
  std::optional<LocalAttempt> started = SpawnAttempt(job);
  if (!started) return;
  std::string drain_stop;
  {
    absl::MutexLock l(&mu);
    LocalAttempt& a = local[absl::StrCat(id, "#", n)];
    a = std::move(*started);
    // DrainNow stops every attempt in `local` after setting `draining`; this one was forked while
    // it did: stop it as DrainNow would have.
    if (draining) {
      drain_stop = "node " + opts.node_name + " draining";
      StopAttempt(&a, drain_stop);
    }
  }
  if (!drain_stop.empty()) (void)store->CompareSet(keys::Stop(id, n), std::nullopt, drain_stop);
  Persist();
}

bool Daemon::Impl::SuperviseAttempt(LocalAttempt* ap, const std::map<std::string, Job>& records,
                                    bool oom_recent) {
  LocalAttempt& a = *ap;
  bool changed = false;
  // Reap first, then report: a rank killed by a signal is reported (and so becomes the root
  // cause) before ranks that exited with an error in the same pass. A rank that loses a peer
  // usually exits on its own (a script's gloo raises "Connection closed by peer"), within the
  // same poll as the peer's death.
  std::vector<std::pair<LocalWorker*, std::string>> ended;
  for (auto& w : a.workers) {
    if (w.exited) continue;
    std::string note;
    if (Reap(a, &w, &note)) ended.emplace_back(&w, std::move(note));
  }
  std::stable_sort(ended.begin(), ended.end(), [](const auto& x, const auto& y) {
    return (x.first->signal != 0) > (y.first->signal != 0);
  });
  if (!ended.empty()) {
    // Another thread (the lease keeper, drain) may have stopped the attempt since this copy was
    // taken, and a rank reaped now may have died of that SIGTERM: take its stop over, so the rank
    // is not reported as failing on its own.
    absl::MutexLock l(&mu);
    auto it = local.find(absl::StrCat(a.job, "#", a.attempt));
    if (it != local.end() && it->second.stopping && !a.stopping) {
      a.stopping = true;
      a.stop_reason = it->second.stop_reason;
      a.term_sent = it->second.term_sent;
    }
    if (it != local.end() && it->second.stop_key_pending) a.stop_key_pending = true;
  }
  // Stopped for a lost node: the stop key before any exit, so the scheduler records the lost node
  // (first writer wins), not the SIGTERMs (lease.cc writes it too when the store answers again).
  if (a.stop_key_pending && !ended.empty()) {
    (void)store->CompareSet(keys::Stop(a.job, a.attempt), std::nullopt, a.stop_reason);
  }
  for (auto& [wp, note] : ended) {
    LocalWorker& w = *wp;
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
  if (a.stopping && !all_exited && clock->Now() - a.term_sent > opts.kill_grace) {
    for (const auto& w : a.workers) {
      if (!w.exited) SignalGroup(w.pid, SIGKILL);
    }
  }
  if (all_exited) {
    // Sweep stragglers of the groups (a worker's own children), then give the devices back.
    for (const auto& w : a.workers) SignalGroup(w.pid, SIGKILL);
    StopTorchStore(a.job, a.attempt);  // script jobs: the attempt's rendezvous ends with it
    {
      // With the lease keeper's claims serialized (ClaimHeldDevices): released in `local` before
      // another claim can read it as unreleased.
      absl::MutexLock c(&claims_mu);
      for (const auto& d : a.devices) (void)store->Delete(keys::Alloc(opts.node_name, d));
      a.released = true;
      absl::MutexLock l(&mu);
      auto it = local.find(absl::StrCat(a.job, "#", a.attempt));
      if (it != local.end()) it->second.released = true;
    }
    changed = true;
    spdlog::info("job {} attempt {}: local ranks done, devices released", a.job, a.attempt);
  }
  return changed;
}

void Daemon::Impl::MergeAttempt(const LocalAttempt& from) {
  auto it = local.find(absl::StrCat(from.job, "#", from.attempt));
  if (it == local.end()) return;
  LocalAttempt& to = it->second;
  for (size_t i = 0; i < to.workers.size() && i < from.workers.size(); ++i) {
    if (to.workers[i].exited || !from.workers[i].exited) continue;
    to.workers[i].exited = true;
    to.workers[i].exit_code = from.workers[i].exit_code;
    to.workers[i].signal = from.workers[i].signal;
  }
  // DrainNow may have stopped the attempt meanwhile: its stop (sent first) stands.
  if (from.stopping && !to.stopping) {
    to.stopping = true;
    to.stop_reason = from.stop_reason;
    to.term_sent = from.term_sent;
  }
  to.released = to.released || from.released;
}

}  // namespace ember::daemon
