// Warm standbys for script jobs (worker.warm_standby): while attempt n runs with restarts left,
// this node keeps one interpreter per local rank for attempt n+1, started kStandbyDelay into
// attempt n (not to slow its start), with worker.preload (default torch) already imported. When
// attempt n+1 is placed on the same ranks and devices here, SpawnAttempt hands each its final
// environment and argv through a "go" file instead of forking: a restart skips the interpreter
// start and the imports (seconds per rank on a busy machine). A standby that is not used (the job
// ended, or attempt n+1 went elsewhere) is killed. Once its imports are done a standby creates
// the empty file <job dir>/.ember/standby-ready-<attempt>-rank-<rank> (ReadyPath), so a benchmark
// or an operator can see that a restart now finds it warm. Control thread only (daemon_impl.h).
#include <signal.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/json.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/jobspec/spec.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

namespace {

constexpr absl::Duration kStandbyDelay = absl::Seconds(3);

// The interpreter's side: import, wait for the go file, become the script (as `python -u script
// args` would run it: __main__, sys.argv, sys.path[0] = the script's directory).
constexpr char kShim[] = R"PY(# Written by emberd (runtime/daemon/standby.cc): a warm standby rank.
import json, os, sys, time
go, preload = sys.argv[1], sys.argv[2]
ready = sys.argv[3] if len(sys.argv) > 3 else ""
for m in filter(None, preload.split(",")):
    try:
        __import__(m)
    except Exception as e:
        print(f"ember standby: preloading {m} failed: {e}", file=sys.stderr, flush=True)
if ready:
    try:
        open(ready, "w").close()
    except OSError as e:
        print(f"ember standby: cannot write {ready}: {e}", file=sys.stderr, flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
with open(go) as f:
    d = json.load(f)
os.environ.update(d["env"])
print(d["header"], flush=True)
sys.argv = d["argv"]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
del go, preload, ready, d, f, m, json, time
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
)PY";

std::string GoPath(const std::string& dir, int attempt, int rank) {
  return absl::StrCat(dir, "/.ember/go-", attempt, "-rank-", rank, ".json");
}

// Created (empty) by the standby once its preloads are imported.
std::string ReadyPath(const std::string& dir, int attempt, int rank) {
  return absl::StrCat(dir, "/.ember/standby-ready-", attempt, "-rank-", rank);
}

}  // namespace

namespace {
bool WantsStandby(const Job& job, int attempt) {
  const auto& w = job.spec().worker();
  return spec::IsScriptJob(job.spec()) && (!w.has_warm_standby() || w.warm_standby()) &&
         attempt < job.spec().max_restarts();
}
}  // namespace

void Daemon::Impl::MaybeStartStandby(const Job& job, const LocalAttempt& a) {
  const std::string key = absl::StrCat(a.job, "#", a.attempt + 1);
  if (standbys.count(key) || a.stopping || a.released || !WantsStandby(job, a.attempt) ||
      clock->Now() - a.started < kStandbyDelay || job.attempts_size() == 0 ||
      job.attempts(job.attempts_size() - 1).number() != a.attempt) {
    return;
  }
  const jobs::v1::Attempt& at = job.attempts(job.attempts_size() - 1);
  const jobs::v1::NodeAssignment* mine = nullptr;
  for (const auto& na : at.assignment().nodes())
    if (na.node() == opts.node_name) mine = &na;
  if (mine == nullptr) return;
  auto identity = ScriptIdentityFor(::geteuid(), opts.script_user, opts.allow_root_scripts);
  if (!identity.ok()) return;
  const std::string dir = JobDir(a.job);
  // .ember/ is the daemon's (group: the script's, which reads the shim and its go file): in the
  // job directory the script can write, a name it planted is moved aside, never written through.
  const gid_t group = identity->switch_user ? identity->gid : kNoGroup;
  auto ember_dir = MakeOwnDir(opts.work_root, a.job + "/.ember", group);
  if (!ember_dir.ok()) {
    spdlog::warn("job {}: no warm standby: {}", a.job, ember_dir.status().ToString());
    return;
  }
  const std::string shim = dir + "/.ember/standby.py";
  if (absl::Status w = WriteFileBelow(opts.work_root, a.job + "/.ember/standby.py", kShim, 0640,
                                      group, /*own_dir=*/true);
      !w.ok()) {
    spdlog::warn("job {}: no warm standby: {}", a.job, w.ToString());
    return;
  }
  std::vector<std::string> preload(job.spec().worker().preload().begin(),
                                   job.spec().worker().preload().end());
  if (preload.empty()) preload = {"torch", "torch.distributed"};
  Standby sb;
  sb.attempt = a.attempt + 1;
  // In attempt n+1's cgroup from the start: taken over, it is that attempt's rank.
  Fd cgroup_procs;
  if (cgroups) {
    auto procs = cgroups->Prepare(ProcessCgroups::LeafName(a.job, sb.attempt));
    if (!procs.ok()) {
      spdlog::warn("job {}: no warm standby: {}", a.job, procs.status().ToString());
      return;
    }
    cgroup_procs = std::move(*procs);
  }
  ScriptLaunch launch;  // the listener is not known yet: the go file brings MASTER_*
  launch.identity = *identity;
  for (const LocalWorker& lw : a.workers) {
    ember::job::WorkerEnv we;
    we.job_id = a.job;
    we.attempt = sb.attempt;
    we.rank = lw.rank;
    we.world_size = at.assignment().world_size();
    we.local_rank = lw.local_rank;
    we.local_world_size = static_cast<int>(a.workers.size());
    we.node_rank = mine->node_rank();
    we.device = DeviceOfKind(lw.device, "cuda") ? lw.device : "cpu";
    we.job_dir = dir;
    we.fr_dump_dir = absl::StrCat(dir, "/flight/attempt-", sb.attempt);
    we.upload_dir = dir + "/uploads";
    SpawnOptions so;
    so.cwd = dir;
    so.log_path = lw.log_path;
    so.die_with_parent = opts.workers_die_with_daemon;
    so.cgroup_procs_fd = cgroup_procs.get();
    so.header = absl::StrCat("=== ember: warm standby for attempt ", sb.attempt, " rank ", lw.rank,
                             " (preloading ", absl::StrJoin(preload, ","), ") ===");
    ScriptSpawnOptions(job, *mine, launch, we, &so);
    so.argv = {job.spec().worker().python(), "-u", shim, GoPath(dir, sb.attempt, lw.rank),
               absl::StrJoin(preload, ","), ReadyPath(dir, sb.attempt, lw.rank)};
    absl::StatusOr<Fd> log = OpenRankLog(lw.log_path);
    absl::StatusOr<pid_t> pid = absl::InternalError("not started");
    if (log.ok()) {
      so.log_fd = log->get();
      pid = SpawnWorker(so);
    } else {
      pid = log.status();
    }
    if (!pid.ok()) {
      spdlog::warn("job {}: no warm standby for rank {}: {}", a.job, lw.rank,
                   pid.status().ToString());
      continue;
    }
    LocalWorker w = lw;
    w.pid = *pid;
    w.exited = false;
    if (auto info = ReadProcInfo(w.pid)) w.start_ticks = info->start_ticks;
    sb.workers.push_back(w);
  }
  spdlog::info("job {}: {} warm standby rank(s) for attempt {}", a.job, sb.workers.size(),
               sb.attempt);
  standbys[key] = std::move(sb);
}

std::optional<pid_t> Daemon::Impl::TakeStandby(const std::string& job, int attempt,
                                               const LocalWorker& w, const SpawnOptions& so,
                                               const ScriptLaunch& launch) {
  auto it = standbys.find(absl::StrCat(job, "#", attempt));
  if (it == standbys.end()) return std::nullopt;
  auto& ws = it->second.workers;
  for (size_t i = 0; i < ws.size(); ++i) {
    if (ws[i].rank != w.rank || ws[i].device != w.device) continue;
    int code = 0, sig = 0;
    if (TryReap(ws[i].pid, &code, &sig)) {  // died while waiting (preload crashed): fork anew
      ws.erase(ws.begin() + i);
      return std::nullopt;
    }
    json::Value env = json::Value::MakeObject();
    for (const auto& [k, v] : so.env) env.Set(k, json::Value::Str(v));
    json::Value argv = json::Value::MakeArray();
    for (size_t j = 2; j < so.argv.size(); ++j) argv.Push(json::Value::Str(so.argv[j]));
    json::Value go = json::Value::MakeObject();
    go.Set("env", std::move(env));
    go.Set("argv", std::move(argv));
    go.Set("header", json::Value::Str(so.header + " (warm standby)"));
    const std::string path = GoPath(JobDir(job), attempt, w.rank);
    const gid_t group = launch.identity.switch_user ? launch.identity.gid : kNoGroup;
    if (absl::Status s = WriteFileBelow(opts.work_root, RelativeTo(opts.work_root, path),
                                        json::Write(go), 0640, group, /*own_dir=*/true);
        !s.ok()) {
      spdlog::warn("job {} rank {}: not using its warm standby: {}", job, w.rank, s.ToString());
      return std::nullopt;
    }
    const pid_t pid = ws[i].pid;
    ws.erase(ws.begin() + i);
    if (ws.empty()) standbys.erase(it);
    return pid;
  }
  return std::nullopt;
}

void Daemon::Impl::SuperviseStandbys(const std::map<std::string, Job>& records,
                                     const std::set<std::string>& started, bool all) {
  for (auto it = standbys.begin(); it != standbys.end();) {
    const std::string job = it->first.substr(0, it->first.rfind('#'));
    auto rec = records.find(job);
    const int current = rec == records.end() || rec->second.attempts_size() == 0
                            ? -1
                            : rec->second.attempts(rec->second.attempts_size() - 1).number();
    // Unused: the job ended or is gone, or its attempt started here (or later ones did) without
    // taking it (placed on other ranks or devices).
    const bool stale = all || rec == records.end() || IsTerminal(rec->second.state()) ||
                       current > it->second.attempt || started.count(it->first) > 0;
    auto& ws = it->second.workers;
    for (size_t i = 0; i < ws.size();) {
      int code = 0, sig = 0;
      if (stale) SignalGroup(ws[i].pid, SIGKILL);
      if (TryReap(ws[i].pid, &code, &sig) || stale) {
        if (stale) {
          for (int k = 0; k < 100 && !TryReap(ws[i].pid, &code, &sig); ++k) {
            absl::SleepFor(absl::Milliseconds(2));
          }
        }
        ws.erase(ws.begin() + i);
      } else {
        ++i;
      }
    }
    if (ws.empty()) {
      // The group made for them goes too, unless their attempt runs here (it is that attempt's
      // then; one started later makes it again).
      bool runs_here = false;
      {
        absl::MutexLock l(&mu);
        auto la = local.find(it->first);
        runs_here = la != local.end() && !la->second.released;
      }
      if (!runs_here) KillAttemptCgroup(job, it->second.attempt);
      it = standbys.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace ember::daemon
