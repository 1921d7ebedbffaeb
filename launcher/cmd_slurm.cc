// Ember inside a Slurm allocation: `run --slurm`, `slurm node` (what it starts on every node with
// srun) and `slurm sbatch`. docs/operations.md "Running on Slurm".
//
// run --slurm SPEC (in the batch script or an salloc shell):
//   1. reads the allocation (launcher/slurm.h) and refuses a job larger than it, before anything
//      starts;
//   2. writes a one-time token into <work-root>/.slurm-<JOBID>/ (the run directory: the nodes'
//      daemon state, the rendezvous file; the work root must be visible on every node);
//   3. `srun --ntasks-per-node=1 --overlap --whole` starts `emberctl slurm node` on every node: an
//      ephemeral emberd (runtime/daemon's Daemon, no systemd) offering that node's share of the
//      ranks; the one on the first node hosts the store and writes its addresses to node-0;
//   4. once every node registered, submits the job, follows it with the live progress line, then
//      stops the daemons (SIGUSR2 to srun, which forwards it) and exits with the job's exit code.
// scancel signals every process of the job: the daemons drain (their workers die with them,
// PR_SET_PDEATHSIG) and emberctl cancels the job; each gives up waiting after kStopGrace. A node
// daemon whose store is gone (the first node failed) stops by itself. SIGUSR1 (the time-limit
// warning) stops the job at its last checkpoint and requeues the Slurm job; the requeued run has
// the same job id (job_id_from_submission) and resumes from <job dir>/checkpoints/latest.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "launcher/cli.h"
#include "launcher/slurm.h"
#include "launcher/standalone.h"
#include "runtime/base/auth.h"
#include "runtime/daemon/daemon.h"
#include "runtime/flight/verdict.h"
#include "runtime/jobspec/spec.h"
#include "runtime/jobspec/yaml_proto.h"
#include "spdlog/spdlog.h"

namespace ember::cli {
namespace {

namespace fs = std::filesystem;

std::string Env(const char* k) {
  const char* v = getenv(k);
  return v ? v : "";
}

std::string SelfExe(const std::string& argv0) {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::absolute(argv0).string() : p.string();
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp, ": ", strerror(errno)));
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ::fsync(fd) == 0 && ok;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// node-0: "API_ADDRESS\nSTORE_ADDRESS\n", written by the first node's daemon once it serves.
absl::StatusOr<std::pair<std::string, std::string>> WaitNode0(const std::string& run_dir,
                                                              absl::Duration timeout,
                                                              const std::function<bool()>& alive) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    auto t = ReadFile(run_dir + "/node-0");
    if (t.ok()) {
      std::vector<std::string> l = absl::StrSplit(*t, '\n', absl::SkipEmpty());
      if (l.size() == 2) return std::make_pair(l[0], l[1]);
    }
    if (alive && !alive()) {
      return absl::UnavailableError("the node daemons (srun) exited before the first node's daemon "
                                    "served; see their output above");
    }
    if (Interrupted()) return absl::CancelledError("interrupted while the daemons started");
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("the first node's daemon did not write ", run_dir,
                                                  "/node-0 within ", absl::FormatDuration(timeout)));
}

// How long a signalled emberctl or node daemon waits for an orderly stop before it exits anyway
// (a node daemon's workers then die with it: PR_SET_PDEATHSIG). scancel wants every process gone
// within a few seconds; Slurm's own SIGKILL comes only KillWait (often 30 s) later.
constexpr absl::Duration kStopGrace = absl::Seconds(3);

// A node daemon whose store stopped answering this long (after Daemon::Healthy's own ~5 s) ends.
constexpr absl::Duration kOrphanAfter = absl::Seconds(3);

// SIGUSR1: Slurm's warning before the time limit (sbatch --signal=B:USR1@SECONDS; the batch
// script execs emberctl, so it is the one warned). The job checkpoints the next step all ranks
// reach and stops (Cancel with checkpoint; within kDrainWait, else a plain cancel keeping the
// last periodic checkpoint), and the Slurm job is requeued; the requeued run resumes from
// checkpoints/latest.
constexpr absl::Duration kDrainWait = absl::Seconds(90);
std::atomic<bool>& RequeueAsked() {
  static std::atomic<bool> asked{false};
  return asked;
}
void OnRequeueSignal(int) {
  RequeueAsked() = true;
  Interrupted() = true;
}

// After a SIGUSR1: `scontrol requeue JOB` (Slurm then stops what is left of this run and queues
// the job again; the job needs --requeue, which `slurm sbatch` writes). Returns the exit code.
int Requeue(const std::string& job_id) {
  std::string cmd = absl::StrCat("scontrol requeue '", job_id, "' 2>&1");
  std::cerr << "emberctl: time-limit warning (SIGUSR1): job stopped at its checkpoint; "
               "requeueing Slurm job " << job_id << "\n" << std::flush;
  // Slurm answers the requeue by ending this run (SIGTERM), possibly before scontrol returns.
  // Exiting first would race it: a batch script that ends before the requeue takes effect makes
  // the job FAILED or COMPLETED. So from here SIGTERM ends emberctl, and otherwise it waits.
  struct sigaction sa = {}, old = {};
  sa.sa_handler = [](int) { _exit(kRequeued); };
  sigaction(SIGTERM, &sa, &old);
  int st = system(cmd.c_str());
  if (st != 0) {
    sigaction(SIGTERM, &old, nullptr);
    std::cerr << "emberctl: scontrol requeue " << job_id << " failed (status " << st
              << "); submit the job with --requeue (emberctl slurm sbatch does)\n";
    return kCancelled;
  }
  for (int i = 0; i < 600; ++i) usleep(100 * 1000);
  return kRequeued;
}

int SpecRanks(const spec::JobSpec& s, bool* cuda) {
  *cuda = s.resources().device_type() == "cuda" || s.parallelism().backend().rfind("nccl", 0) == 0;
  return std::max(1, s.parallelism().world_size());
}

}  // namespace

int RunSlurm(Ctl& ctl) {
  const Args& a = ctl.args();
  if (a.Has("--standalone")) return ctl.UsageError("run: --slurm and --standalone exclude each other");
  for (const char* o : {"--max-ranks", "--http", "--allow-root-scripts", "--script-user", "--emulate-gpus"}) {
    if (a.Has(o)) {
      return ctl.UsageError(absl::StrCat("run --slurm: ", o, " is for --standalone (the allocation "
                                         "sizes a Slurm run)"));
    }
  }
  int nproc = 0;
  if (!ctl.IntOption("--nproc", 1, &nproc)) return kUsage;
  spec::JobSpec parsed;
  std::map<std::string, std::string> files;
  absl::Status s = ReadJob(ctl, nproc, &parsed, &files);
  if (!s.ok()) return ctl.Fail(s);
  const spec::JobSpec* spec = &parsed;
  const std::string yaml = spec::ToYaml(parsed);  // what is submitted: the parsed spec
  bool cuda = false;
  const int world = SpecRanks(*spec, &cuda);
  auto alloc = slurm::AllocationFromEnv([](const char* k) { return Env(k); }, slurm::ExpandHostnames);
  if (!alloc.ok()) return ctl.Fail(alloc.status());
  auto plan = slurm::PlanRanks(*alloc, world, cuda);
  if (!plan.ok()) return ctl.Fail(plan.status());
  std::string worker = a.Get("--worker");
  if (worker.empty()) {
    auto found = FindWorkerBinary(ctl.argv0());
    if (!found.ok() && spec::IsScriptJob(*spec)) found = std::string("/bin/false");
    if (!found.ok()) return ctl.Fail(found.status());
    worker = *found;
  }
  const std::string work_root = Ctl::UserPath(a.Get("--work-root", "ember-jobs"));
  const std::string run_dir = absl::StrCat(work_root, "/.slurm-", alloc->job_id);
  std::error_code ec;
  fs::remove_all(run_dir, ec);  // a requeued job starts its daemons afresh
  fs::create_directories(run_dir, ec);
  if (ec || ::chmod(run_dir.c_str(), 0700) != 0) {
    return ctl.Fail(absl::PermissionDeniedError(absl::StrCat(
        "cannot create ", run_dir, ": ", ec ? ec.message() : strerror(errno),
        "; pass --work-root DIR on a file system every node sees")));
  }
  const std::string token = base::GenerateToken();
  s = WriteFileAtomic(run_dir + "/token", token + "\n", 0600);
  if (!s.ok()) return ctl.Fail(s);

  // SIGTERM (scancel, preemption) and SIGHUP cancel like Ctrl-C; SIGUSR1 stops and requeues.
  for (int sig : {SIGTERM, SIGHUP, SIGUSR1}) {
    struct sigaction sa = {};
    sa.sa_handler = sig == SIGUSR1 ? OnRequeueSignal : OnInterrupt;
    sigaction(sig, &sa, nullptr);
  }
  const int nnodes = static_cast<int>(alloc->nodes.size());
  std::vector<std::string> argv = {
      "srun", absl::StrCat("--nodes=", nnodes), absl::StrCat("--ntasks=", nnodes),
      "--ntasks-per-node=1", "--overlap", "--whole", "--kill-on-bad-exit=1",
      "--job-name=ember-daemons", SelfExe(ctl.argv0()), "slurm", "node", "--run-dir", run_dir,
      "--work-root", work_root, "--worker", worker, "--ranks", absl::StrJoin(*plan, ",")};
  if (cuda) argv.push_back("--cuda");
  if (!ctl.json()) {
    std::cerr << "emberctl: Slurm job " << alloc->job_id << ": " << world << " ranks on "
              << nnodes << " nodes (" << absl::StrJoin(alloc->nodes, ",") << ": "
              << absl::StrJoin(*plan, ",") << " per node); starting the node daemons\n";
  }
  pid_t srun = fork();
  if (srun == 0) {
    std::vector<char*> cargv;
    for (auto& x : argv) cargv.push_back(x.data());
    cargv.push_back(nullptr);
    execvp("srun", cargv.data());
    _exit(127);
  }
  if (srun < 0) return ctl.Fail(absl::InternalError(absl::StrCat("fork: ", strerror(errno))));
  int srun_status = 0;
  std::atomic<bool> srun_done{false};  // the watch thread asks too
  auto srun_alive = [&] {
    if (!srun_done && waitpid(srun, &srun_status, WNOHANG) == srun) srun_done = true;
    return !srun_done;
  };
  // SIGUSR2 is forwarded by srun to every task (SIGTERM would make srun kill the step): the
  // daemons drain and exit 0, and srun with them.
  auto stop_daemons = [&] {
    if (srun_alive()) kill(srun, SIGUSR2);
    for (int i = 0; i < 200 && srun_alive(); ++i) absl::SleepFor(absl::Milliseconds(50));
    if (srun_alive()) {
      kill(srun, SIGKILL);
      waitpid(srun, &srun_status, 0);
      srun_done = true;
    }
  };
  int rc = [&]() -> int {
    auto addrs = WaitNode0(run_dir, absl::Seconds(60), srun_alive);
    if (!addrs.ok()) return ctl.Fail(addrs.status());
    ClientOptions co;
    co.address = addrs->first;
    co.token = token;
    auto c = Client::Connect(co);
    if (!c.ok()) return ctl.Fail(c.status());
    // Every node's daemon registered before the job is placed.
    const absl::Time end = absl::Now() + absl::Seconds(60);
    size_t seen = 0;
    while (true) {
      auto n = c->Nodes();
      if (n.ok()) seen = n->size();
      if (seen >= static_cast<size_t>(nnodes)) break;
      if (!srun_alive() || Interrupted() || absl::Now() > end) {
        return ctl.Fail(absl::UnavailableError(absl::StrCat(
            "only ", seen, " of ", nnodes, " node daemons registered",
            Interrupted() ? " (interrupted)" : srun_done ? " before srun exited" : " within 60 s")));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    // One submission per Slurm job: the daemons name the job after it (job_id_from_submission),
    // so a requeued run has the same job directory and resumes from its checkpoints. The cluster
    // name keeps two Slurm clusters' job 17 apart on a shared host (a daemon's sweep of a job's
    // processes goes by its job id).
    const std::string cluster = Env("SLURM_CLUSTER_NAME");
    auto r = c->Submit(yaml,
                       absl::StrCat("slurm-", cluster.empty() ? "" : cluster + "-", alloc->job_id),
                       files);
    if (!r.ok()) return ctl.Fail(r.status());
    if (!ctl.json()) {
      std::cerr << "emberctl: running " << r->job().id() << " (" << r->job().world_size()
                << " ranks, logs in " << r->job().job_dir() << "/logs)\n";
    }
    // A signal (scancel, preemption, Ctrl-C) cancels the job. Slurm signals the daemons too, and
    // once the store is gone nothing answers: after kStopGrace emberctl ends the daemons' step
    // and exits as cancelled rather than wait on them (scancel's SIGKILL is KillWait away).
    // Slurm's reason, when a node failed or was set down (once; as soon as the signal is seen).
    std::atomic<bool> explained{false};
    auto explain = [&] {
      if (RequeueAsked() || explained.exchange(true)) return;
      for (const auto& n : alloc->nodes) {
        std::string why = slurm::NodeTrouble(n);
        if (!why.empty()) std::cerr << "emberctl: stopped by Slurm: " << why << "\n" << std::flush;
      }
    };
    absl::Notification followed;
    std::thread watch([&] {
      while (!followed.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
        if (Interrupted()) {
          explain();  // first: on a node failure Slurm kills this step within ~0.2 s
          if (RequeueAsked()) {
            // The time-limit warning: checkpoint the next step every rank reaches, then stop, so
            // the requeued run loses no step (kDrainWait of the 120 s warning; then as a cancel).
            std::cerr << "emberctl: time-limit warning (SIGUSR1): checkpointing the next step\n" << std::flush;
            (void)c->Cancel(r->job().id(), /*checkpoint=*/true);
            if (followed.WaitForNotificationWithTimeout(kDrainWait)) return;
            std::cerr << "emberctl: no checkpoint within " << absl::FormatDuration(kDrainWait)
                      << "; stopping at the last one\n" << std::flush;
          }
          (void)c->Cancel(r->job().id());
          if (!followed.WaitForNotificationWithTimeout(kStopGrace)) {
            if (srun_alive()) kill(srun, SIGKILL);
            std::cerr << "emberctl: interrupted; the daemons did not answer within "
                      << absl::FormatDuration(kStopGrace) << ", exiting\n";
            _exit(RequeueAsked() ? Requeue(alloc->job_id) : kCancelled);
          }
          return;
        }
      }
    });
    // The watch thread above owns stopping the job on a signal (a drain on the time-limit
    // warning, else a cancel): Follow only follows. Its own plain cancel on the same signal raced
    // the drain and sometimes won (requeue_test: the requeued run redid 9 steps).
    int job_rc = Follow(ctl, *c, r->job().id(), /*cancel_on_interrupt=*/false);
    if (Interrupted()) explain();
    followed.Notify();
    watch.join();
    auto j = c->Get(r->job().id());
    if (j.ok() && !ctl.json()) {  // where each attempt ran: node[devices]
      for (const auto& at : j->attempts()) {
        std::vector<std::string> where;
        for (const auto& na : at.assignment().nodes()) {
          where.push_back(absl::StrCat(na.node(), "[", absl::StrJoin(na.devices(), ","), "]"));
        }
        std::cerr << "emberctl: attempt " << at.number() << " ran on " << absl::StrJoin(where, " ")
                  << "\n";
      }
    }
    return job_rc;
  }();
  stop_daemons();
  fs::remove(run_dir + "/token", ec);

  if (RequeueAsked()) return Requeue(alloc->job_id);
  return rc;
}

int RunSlurmNode(Ctl& ctl) {
  const Args& a = ctl.args();
  const std::string run_dir = a.Get("--run-dir"), node = Env("SLURMD_NODENAME");
  int id = -1;
  if (run_dir.empty() || node.empty() || !absl::SimpleAtoi(Env("SLURM_NODEID"), &id) || id < 0) {
    return ctl.UsageError("slurm node: runs under srun (SLURMD_NODENAME, SLURM_NODEID) with "
                          "--run-dir; `run --slurm` starts it");
  }
  std::vector<std::string> ranks = absl::StrSplit(a.Get("--ranks"), ',');
  int mine = 0;
  if (id >= static_cast<int>(ranks.size()) || !absl::SimpleAtoi(ranks[id], &mine) || mine < 0) {
    return ctl.UsageError(absl::StrCat("slurm node: --ranks '", a.Get("--ranks"),
                                       "' has no count for node ", id));
  }
  auto token = ReadFile(run_dir + "/token");
  if (!token.ok()) return ctl.Fail(token.status());
  auto addr = slurm::NodeAddress(node);
  if (!addr.ok()) return ctl.Fail(addr.status());
  const bool cuda = a.Has("--cuda");

  daemon::DaemonOptions o;
  o.node_name = node;
  o.listen = *addr + ":0";
  o.auth_token = std::string(absl::StripAsciiWhitespace(*token));
  o.work_root = a.Get("--work-root");
  o.state_dir = absl::StrCat(run_dir, "/emberd-", node);
  o.worker_binary = a.Get("--worker");
  o.inventory.cpu_slots = cuda ? 0 : mine;
  o.inventory.cuda_devices = cuda ? mine : 0;
  o.workers_die_with_daemon = true;  // ephemeral: nothing outlives the step
  o.kill_grace = absl::Seconds(2);    // Slurm has already sent the workers SIGTERM on scancel
  o.reap_orphans = true;
  o.job_id_from_submission = true;  // a requeued run finds its job directory
  o.allow_root_scripts = ::geteuid() == 0;  // the allocation's owner runs their own script
  o.analyze_flight = FlightVerdict;
  if (id == 0) {
    o.host_store = true;
    o.store_listen = *addr + ":0";
  } else {
    auto addrs = WaitNode0(run_dir, absl::Seconds(60), nullptr);
    if (!addrs.ok()) return ctl.Fail(addrs.status());
    o.store_address = addrs->second;
  }
  // Signals are taken by this thread; the daemon's threads inherit the mask.
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR2}) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto d = daemon::Daemon::Start(o);
  if (!d.ok()) return ctl.Fail(d.status());
  if (id == 0) {
    absl::Status w = WriteFileAtomic(run_dir + "/node-0",
                                     absl::StrCat((*d)->address(), "\n", (*d)->store_address(), "\n"),
                                     0600);
    if (!w.ok()) return ctl.Fail(w);
  }
  // Until a signal, or until the store is gone for good: a daemon whose store heartbeat has
  // stalled (Daemon::Healthy) for kOrphanAfter is an orphan (the first node failed, was set DOWN,
  // or its launcher was killed without its step) and stops, so nothing of the job stays behind.
  absl::Time unhealthy_since = absl::InfiniteFuture();
  while (true) {
    timespec tick = {0, 500 * 1000 * 1000};
    if (sigtimedwait(&set, nullptr, &tick) > 0) break;
    if ((*d)->Healthy()) {
      unhealthy_since = absl::InfiniteFuture();
    } else if (unhealthy_since == absl::InfiniteFuture()) {
      unhealthy_since = absl::Now();
    } else if (absl::Now() - unhealthy_since > kOrphanAfter) {
      std::cerr << "emberctl slurm node " << node << ": the store at " << (*d)->store_address()
                << " has not answered for " << absl::FormatDuration(absl::Now() - unhealthy_since)
                << " (the first node is gone); stopping this node's daemon and workers\n";
      break;
    }
  }
  // The daemons stop together: the store on the first node may go before the others have
  // deregistered, which they would log as warnings.
  if (spdlog::default_logger()->level() >= spdlog::level::warn) {  // not emberctl's debug mode
    spdlog::set_level(spdlog::level::err);
  }
  // Drain stops the workers (SIGTERM, SIGKILL after kill_grace) and deregisters; with the store
  // already gone (the first node stopped first) deregistering would wait for it: bounded here.
  absl::Notification drained;
  std::thread drain([&] {
    (*d)->Drain();
    drained.Notify();
  });
  if (!drained.WaitForNotificationWithTimeout(kStopGrace)) _exit(kOk);
  drain.join();
  d->reset();
  return kOk;
}

int RunSlurmSbatch(Ctl& ctl) {
  const Args& a = ctl.args();
  const std::string path = Ctl::UserPath(ctl.rest()[0]);
  spec::JobSpec parsed;
  std::map<std::string, std::string> files;
  absl::Status s = ReadJob(ctl, 0, &parsed, &files);
  if (!s.ok()) return ctl.Fail(s);
  const spec::JobSpec* spec = &parsed;
  bool cuda = false;
  const int world = SpecRanks(*spec, &cuda);
  int nodes = 1, gpus = 0;
  if (!ctl.IntOption("--nodes", 1, &nodes) || !ctl.IntOption("--gpus-per-node", 1, &gpus)) {
    return kUsage;
  }
  if (gpus > 0 && !cuda) {
    return ctl.UsageError("--gpus-per-node is for a cuda job (resources.device_type: cuda)");
  }
  slurm::SbatchOptions o;
  o.emberctl = SelfExe(ctl.argv0());
  o.spec = path;
  o.job_name = spec->name().empty() ? "ember" : spec->name();
  o.nodes = nodes;
  o.ranks_per_node = (world + nodes - 1) / nodes;
  if (cuda) {
    if (gpus == 0) gpus = o.ranks_per_node;
    if (gpus * nodes < world) {
      return ctl.Fail(absl::InvalidArgumentError(absl::StrCat(
          "parallelism.world_size: the job asks for ", world, " ranks but --nodes ", nodes,
          " x --gpus-per-node ", gpus, " = ", gpus * nodes, " GPUs")));
    }
    o.gpus_per_node = gpus;
  }
  if (world < nodes) {
    return ctl.Fail(absl::InvalidArgumentError(absl::StrCat(
        "--nodes: ", nodes, " nodes for ", world, " ranks (parallelism.world_size) leaves nodes idle")));
  }
  o.time = a.Get("--time");
  o.warn_before_s = o.time.empty() ? 0 : 120;
  if (!ctl.IntOption("--warn-before", 0, &o.warn_before_s)) return kUsage;
  if (o.warn_before_s > 0 && o.time.empty()) {
    return ctl.UsageError("--warn-before needs --time (the warning comes before the time limit)");
  }
  o.partition = a.Get("--partition");
  if (a.Has("--work-root")) o.work_root = Ctl::UserPath(a.Get("--work-root"));
  o.output = a.Get("--out-file", absl::StrCat(o.job_name, "-%j.out"));
  const std::string script = slurm::SbatchScript(o);
  if (a.Has("--dry-run")) {
    std::cout << script;
    return kOk;
  }
  const std::string file = absl::StrCat(Ctl::UserPath(a.Get("--script-dir", ".")), "/", o.job_name,
                                        ".sbatch");
  s = WriteFileAtomic(file, script, 0644);
  if (!s.ok()) return ctl.Fail(s);
  std::string cmd = absl::StrCat("sbatch --parsable '", file, "' 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  size_t got;
  while (p && (got = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
  int st = p ? pclose(p) : -1;
  out = std::string(absl::StripAsciiWhitespace(out));
  if (st != 0) {
    return ctl.Fail(absl::UnavailableError(absl::StrCat("sbatch ", file, " failed: ", out)));
  }
  std::string id = out.substr(0, out.find(';'));  // "JOBID[;CLUSTER]"
  if (ctl.json()) std::cout << "{\"slurm_job_id\": " << Ctl::Quote(id) << ", \"script\": " << Ctl::Quote(file) << "}\n";
  else std::cout << id << "\n";
  if (!ctl.json()) std::cerr << "emberctl: submitted " << file << " as Slurm job " << id << "\n";
  return kOk;
}

}  // namespace ember::cli
