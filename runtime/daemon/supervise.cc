// Supervision (every node, on the control thread): starts the ranks the scheduler placed on this
// node, reaps them, reports their exits to the store, stops attempts and gives devices back.
// The lock rule (daemon_impl.h): mu is held only to copy attempts out of `local` and to merge the
// results back; forks, store calls, waits and file writes happen on the copies without it.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/auth.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/env_knobs.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/job_files.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/placement.h"
#include "runtime/daemon/process.h"
#include "runtime/job/env.h"
#include "runtime/jobspec/spec.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

using jobs::v1::RankExit;

namespace {

// The job's files from the store: its uploads under <job>/uploads, then the spec as
// <job>/job.yaml, written only when every upload is in place (on a shared work root its presence
// tells other daemons the files are complete, and they do not fetch them again). The first
// failure, with job.yaml not written. Each file is 0640 (group `group`: the script's user reads
// them), written whole under a fresh O_EXCL name and renamed into place (never through a symlink
// or a name the script planted: job_files.h), so a reader sees the old file or the whole new one.
absl::Status FetchJobFiles(store::Client& store, const std::string& job_id,
                           const std::string& work_root, gid_t group) {
  auto spec = store.Get(keys::SpecYaml(job_id));
  if (!spec.ok()) return base::Annotate(spec.status(), "reading the job's spec");
  const std::string prefix = keys::FilesPrefix(job_id);
  auto names = store.ListKeys(prefix);
  if (!names.ok()) return base::Annotate(names.status(), "listing the job's uploads");
  const std::string uploads = job_id + "/uploads";
  for (const std::string& k : *names) {
    RETURN_IF_ERROR(base::Annotate(CheckUploadName(k.substr(prefix.size())),
                                   "an upload in the store (refused; nothing written)"));
  }
  for (const std::string& k : *names) {
    const std::string rel = k.substr(prefix.size());
    auto v = store.Get(k);
    if (!v.ok()) return base::Annotate(v.status(), absl::StrCat("reading upload '", rel, "'"));
    const size_t slash = rel.rfind('/');
    if (slash != std::string::npos) {
      auto d = OpenDirBelow(work_root, absl::StrCat(uploads, "/", rel.substr(0, slash)),
                            /*create=*/true, /*own=*/true, group);
      if (!d.ok()) return base::Annotate(d.status(), absl::StrCat("writing upload '", rel, "'"));
    }
    RETURN_IF_ERROR(base::Annotate(
        WriteFileBelow(work_root, absl::StrCat(uploads, "/", rel), *v, 0640, group, true),
        absl::StrCat("writing upload '", rel, "'")));
  }
  // The job directory itself may be the script's: job.yaml is renamed into it, never opened.
  return WriteFileBelow(work_root, job_id + "/job.yaml", *spec, 0640, group, /*own_dir=*/false);
}

// True when <job>/job.yaml is a regular file (a symlink there is not: the files are fetched again).
bool HasJobYaml(const std::string& work_root, const std::string& job_id) {
  auto dir = OpenDirBelow(work_root, job_id, /*create=*/false, /*own=*/false);
  struct stat st;
  return dir.ok() && ::fstatat(dir->get(), "job.yaml", &st, AT_SYMLINK_NOFOLLOW) == 0 &&
         S_ISREG(st.st_mode);
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
  // (docs/operations.md, "File permissions"). A script job run as script_user owns the job
  // directory, checkpoints/ and flight/; logs/ and uploads/ stay the daemon's (MakeJobDirs).
  const std::string uploads = dir + "/uploads";
  std::string fr_dir = absl::StrCat(dir, "/flight/attempt-", at.number());
  std::optional<ScriptIdentity> runs_as;  // set when the ranks run as another user
  if (spec::IsScriptJob(job.spec())) {
    auto id = ScriptIdentityFor(::geteuid(), opts.script_user, opts.allow_root_scripts);
    if (id.ok() && id->switch_user) runs_as = *id;
  }
  const gid_t group = runs_as ? runs_as->gid : kNoGroup;
  // The record came from the store, which is not trusted: its id was checked (ReadRecord), the
  // directories are made under the work root without following a symlink (MakeJobDirs), and the
  // spec's paths and a script's environment are checked against this node's policy first.
  absl::Status checked = CheckSpecPaths(job.spec(), opts.data_roots);
  if (checked.ok() && spec::IsScriptJob(job.spec())) checked = CheckScriptEnv(job.spec());
  checked = base::Annotate(checked, "the job's record in the store (refused by this node)");
  absl::Status dirs = checked.ok() ? MakeJobDirs(job.id(), at.number(), runs_as) : checked;
  // job.yaml last: on a work root shared by several daemons its presence means the uploads are
  // all in place too (written first, it let another host start its workers while the uploads
  // were still being fetched from the store: seen with 10 ms RTT between the hosts).
  // A store that did not answer: the next pass tries again. Any other failure fails this node's
  // ranks with the reason, as a fork failure would (before, job.yaml was written anyway, and the
  // attempt ran without the upload; on a shared work root every later attempt did too).
  absl::Status start_error = dirs;
  if (start_error.ok() && !HasJobYaml(opts.work_root, job.id())) {
    absl::Status files = FetchJobFiles(*store, job.id(), opts.work_root, group);
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
  // The attempt's cgroup (cgroup.h): each rank joins it between fork and exec, so nothing it
  // starts is ever outside it. One that cannot be made fails the ranks, as a fork failure would
  // (they would run with nothing to end their descendants).
  Fd cgroup_procs;
  if (start_error.ok() && cgroups) {
    auto procs = cgroups->Prepare(ProcessCgroups::LeafName(job.id(), at.number()));
    if (procs.ok()) cgroup_procs = std::move(*procs);
    else start_error = base::Annotate(procs.status(), "the attempt's cgroup");
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
    so.cgroup_procs_fd = cgroup_procs.get();
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
    we.replica_dir = absl::StrCat(ReplicaRoot(), "/", job.id());  // fault_tolerance.replicas: memory
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
    absl::StatusOr<pid_t> pid = absl::InternalError("not started");
    if (warm) {
      pid = *warm;
    } else if (!start_error.ok()) {
      pid = start_error;
    } else {
      // Opened here, never by path in the child's parent: logs/ is the daemon's own directory.
      absl::StatusOr<Fd> log = OpenRankLog(w.log_path);
      if (log.ok()) {
        so.log_fd = log->get();
        pid = SpawnWorker(so);
      } else {
        pid = log.status();
      }
    }
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
  ReapOrphans(/*kill=*/false);  // orphans re-parented here that ended (reap_orphans)
  if (active.ok()) SweepReplicas(records);  // only with the store's answer: never on a failed read
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
      for (auto& line : TailOwnFile(opts.work_root, RelativeTo(opts.work_root, w.log_path),
                                    opts.last_log_lines)) {
        e.add_last_log_lines(line);
      }
      if (!note.empty()) e.add_last_log_lines(note);
    }
    (void)store->Set(keys::Exit(a.job, a.attempt, w.rank), e.SerializeAsString());
    // A rank that fails on its own (not one we stopped, not one that obeyed the stop key with
    // exit code 75) is a root-cause candidate; the first writer of the failure key wins across
    // every node.
    // 76: checkpointed and stopped on a drain request (Cancel with checkpoint); not a failure either.
    const bool obeyed_stop = w.signal == 0 && (w.exit_code == 75 || w.exit_code == 76);
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
    // Sweep stragglers of the groups (a worker's own children) and every other process of the
    // attempt's ranks here (a daemonised one left the group), then give the devices back.
    for (const auto& w : a.workers) SignalGroup(w.pid, SIGKILL);
    SweepAttempt(a);
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

void Daemon::Impl::SweepReplicas(const std::map<std::string, Job>& records) {
  if (clock->Now() - last_replica_sweep < absl::Seconds(2)) return;
  last_replica_sweep = clock->Now();
  const std::string root = ReplicaRoot();
  std::error_code ec;
  if (!std::filesystem::is_directory(std::filesystem::symlink_status(root, ec))) return;
  std::set<std::string> here;
  {
    absl::MutexLock l(&mu);
    for (const auto& [key, a] : local) {
      if (!a.released) here.insert(a.job);
    }
  }
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string job = e.path().filename().string();
    auto it = records.find(job);
    const bool active = it != records.end() && !IsTerminal(it->second.state());
    if (active || here.count(job)) continue;
    // remove_all does not follow symlinks; the root is 0700 and this user's (OpenReplicaDir).
    std::error_code rm;
    const auto n = std::filesystem::remove_all(e.path(), rm);
    if (rm) spdlog::warn("in-memory replicas of job {}: cannot remove {}: {}", job, e.path().string(), rm.message());
    else spdlog::info("in-memory replicas of job {}: removed {} ({} files; the job is not running here)", job, e.path().string(), n);
  }
}

absl::Status Daemon::Impl::MakeJobDirs(const std::string& job, int attempt,
                                       const std::optional<ScriptIdentity>& runs_as) {
  RETURN_IF_ERROR(CheckJobId(job));  // ReadRecord checked it; a directory name must never be ".."
  const gid_t group = runs_as ? runs_as->gid : kNoGroup;
  // The script's own directories: its working directory, checkpoints and flight dumps.
  for (const std::string& rel : {job, job + "/checkpoints", job + "/flight",
                                 absl::StrCat(job, "/flight/attempt-", attempt)}) {
    ASSIGN_OR_RETURN(Fd d, OpenDirBelow(opts.work_root, rel, /*create=*/true, /*own=*/false));
    ::fchmod(d.get(), 0750);
    if (runs_as && ::fchown(d.get(), runs_as->uid, runs_as->gid) != 0) {
      return absl::InternalError(absl::StrCat("cannot chown ", opts.work_root, "/", rel,
                                              " to uid ", runs_as->uid, ": ", strerror(errno)));
    }
  }
  // The daemon's: what it writes there must not be redirected by the script.
  ASSIGN_OR_RETURN(Fd logs, MakeOwnDir(opts.work_root, job + "/logs", group));
  bool fresh_uploads = false;
  ASSIGN_OR_RETURN(Fd uploads, MakeOwnDir(opts.work_root, job + "/uploads", group, &fresh_uploads));
  if (fresh_uploads) {  // its files went aside with it: fetch them again (job.yaml marks them)
    ASSIGN_OR_RETURN(Fd d, OpenDirBelow(opts.work_root, job, /*create=*/false, /*own=*/false));
    ::unlinkat(d.get(), "job.yaml", 0);
  }
  return absl::OkStatus();
}

absl::StatusOr<Fd> Daemon::Impl::OpenRankLog(const std::string& log_path) const {
  const std::string rel = RelativeTo(opts.work_root, log_path);
  if (rel.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("log ", log_path, " is not under the work root ", opts.work_root));
  }
  return OpenFileBelow(opts.work_root, rel, O_WRONLY | O_CREAT | O_APPEND, 0640, /*own_dir=*/true);
}

void Daemon::Impl::SweepAttempt(const LocalAttempt& a) {
  std::vector<int> ranks;
  for (const auto& w : a.workers) ranks.push_back(w.rank);
  std::vector<uid_t> uids = {::geteuid()};
  auto id = ScriptIdentityFor(::geteuid(), opts.script_user, opts.allow_root_scripts);
  if (id.ok() && id->switch_user) uids.push_back(id->uid);
  // The cgroup first: it holds every descendant, whatever its session or environment.
  const int in_cgroup = KillAttemptCgroup(a.job, a.attempt);
  const int n = KillAttemptProcesses(a.job, a.attempt, ranks, uids);
  ReapOrphans(/*kill=*/true);
  if (in_cgroup > 0) {
    spdlog::warn("job {} attempt {}: killed {} process(es) its ranks left behind in its cgroup",
                 a.job, a.attempt, in_cgroup);
  }
  if (n > 0) {
    spdlog::warn("job {} attempt {}: killed {} process(es) its ranks left behind (outside their "
                 "process groups{})", a.job, a.attempt, n, cgroups ? " and its cgroup" : "");
  }
}

int Daemon::Impl::KillAttemptCgroup(const std::string& job, int attempt) {
  if (!cgroups) return 0;
  int killed = 0;
  absl::Status s = cgroups->KillAndRemove(ProcessCgroups::LeafName(job, attempt), &killed);
  if (!s.ok()) spdlog::warn("job {} attempt {}: its cgroup: {}", job, attempt, s.ToString());
  return killed;
}

void Daemon::Impl::ReapOrphans(bool kill) {
  if (!opts.reap_orphans) return;
  std::vector<pid_t> children = ChildrenOfSelf();
  if (children.empty()) return;
  std::set<pid_t> known;
  {
    absl::MutexLock l(&mu);
    for (const auto& [k, a] : local) {
      for (const auto& w : a.workers) {
        if (!w.exited) known.insert(w.pid);
      }
    }
  }
  for (const auto& [k, sb] : standbys) {
    for (const auto& w : sb.workers) known.insert(w.pid);
  }
  int killed = 0;
  for (pid_t c : children) {
    if (known.count(c) || c <= 1) continue;
    if (kill && ::kill(c, SIGKILL) == 0) ++killed;
    int status = 0;
    // A killed one is reaped once it has died (at most ~100 ms); a running one is left alone.
    for (int i = 0; ::waitpid(c, &status, WNOHANG) == 0 && kill && i < 50; ++i) {
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
  if (killed > 0) spdlog::warn("killed {} orphaned process(es) of ended ranks", killed);
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
