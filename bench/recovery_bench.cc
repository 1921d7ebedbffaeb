// recovery_bench: what a worker's kill -9 costs (issue 8). Two in-process daemons x 2 CPU slots on
// loopback run a 4-rank job of the real ember-worker (tiny GPT, deterministic, checkpoint every
// --every steps, progress every step). At --kill_at steps rank 1 gets SIGKILL; measured:
//
//   others_stopped_s   kill -9 -> every other rank of the attempt has exited (target < 5 s;
//                      torchrun's survivors wait for the collective timeout, NCCL's default 10 min)
//   detect_s           kill -9 -> the job record leaves RUNNING (RESTARTING)
//   first_step_s       kill -9 -> the restarted attempt's first step is reported, minus the
//                      worker's own checkpoint load time (target < 15 s; includes emberd's
//                      default 1 s restart backoff)
//   ckpt_load_s        the restarted rank 0's checkpoint load (from its log)
//   progress_lost      steps done at the kill minus the step resumed from (target <= --every)
//
// The same kill with fault_tolerance: {replicas: memory, every_steps: 1} (issue 35; in-memory
// replicas, docs/operations.md), interleaved round by round with the disk rounds, in a second
// table: the job resumes from memory ("resumed from memory ... of step N" in rank 0's log), no
// checkpoint load; progress lost target 0.
//
//   bazel run -c opt //bench:recovery_bench -- [--json] [--rounds=3] [--quick]
//
// Each round is a fresh job; one row per round, targets on the median (progress lost: the
// maximum). All targets are absolute (no peer). --quick: one round of a shorter job.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <regex>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/report.h"
#include "runtime/base/flags.h"
#include "runtime/daemon/process.h"
#include "testing/cluster.h"
#include "testing/harness.h"

ABSL_FLAG(int, rounds, 3, "kills measured (a fresh job each)");
ABSL_FLAG(int, steps, 60, "steps of the job");
ABSL_FLAG(int, every, 10, "checkpoint interval (steps)");
ABSL_FLAG(int, kill_at, 25, "kill rank 1 once rank 0 reported this step");

namespace ember {
namespace {

using recovery::WaitFor;

struct Round {
  double others_stopped_s = -1, detect_s = -1, first_step_s = -1, ckpt_load_s = 0;
  int64_t killed_at = 0, resumed_from = -1;
  bool ok = false;
};

using bench::Median;

Round Measure(Client& c, int round, bool replicas) {
  Round out;
  const int every = absl::GetFlag(FLAGS_every);
  const std::string extra = replicas ? "max_restarts: 1\nfault_tolerance: {replicas: memory, every_steps: 1}\n"
                                     : "max_restarts: 1\n";
  auto r = c.Submit(recovery::TinySpec(absl::StrCat(replicas ? "bench-mem-" : "bench-kill-", round), 4,
                                       absl::GetFlag(FLAGS_steps), every, extra),
                    "", {{"data/tiny_corpus.txt", recovery::Corpus()}});
  if (!r.ok()) {
    std::fprintf(stderr, "submit: %s\n", r.status().ToString().c_str());
    return out;
  }
  const std::string id = r->job().id();
  int64_t step = 0;
  if (!WaitFor([&] {
        auto j = c.Get(id);
        if (j.ok()) step = j->progress().metrics().step();
        return step >= absl::GetFlag(FLAGS_kill_at);
      }, absl::Seconds(120), absl::Milliseconds(5))) {
    std::fprintf(stderr, "job %s never reached step %d\n", id.c_str(), absl::GetFlag(FLAGS_kill_at));
    return out;
  }
  const pid_t victim = recovery::RankPid(id, 0, 1);
  if (victim <= 0) return out;
  out.killed_at = step;
  const absl::Time t0 = absl::Now();
  kill(victim, SIGKILL);
  WaitFor([&] {
    for (int rank : {0, 2, 3})
      if (recovery::RankPid(id, 0, rank) > 0) return false;
    return true;
  }, absl::Seconds(60), absl::Milliseconds(2));
  out.others_stopped_s = absl::ToDoubleSeconds(absl::Now() - t0);
  WaitFor([&] {
    auto j = c.Get(id);
    if (j.ok() && j->state() != jobs::v1::RUNNING && out.detect_s < 0) {
      out.detect_s = absl::ToDoubleSeconds(absl::Now() - t0);
    }
    return j.ok() && j->attempts_size() == 2 && j->progress().metrics().step() > 0;
  }, absl::Seconds(60), absl::Milliseconds(5));
  const double restarted = absl::ToDoubleSeconds(absl::Now() - t0);
  auto done = c.Wait(id, absl::Seconds(180));
  if (!done.ok() || done->state() != jobs::v1::SUCCEEDED) return out;
  // Rank 0's log of the new attempt: "resumed from .../step-N (step N, ..." and the load time.
  std::string log = recovery::ReadFile(done->job_dir() + "/logs/rank-0.log");
  std::smatch m;
  if (std::regex_search(log, m, std::regex("resumed from \\S+ \\(step ([0-9]+)"))) {
    out.resumed_from = std::stoll(m[1]);
  }
  if (replicas) {
    out.resumed_from = -1;  // must come from memory
    if (std::regex_search(log, m, std::regex("resumed from memory: the .* in-memory replica of step ([0-9]+)"))) {
      out.resumed_from = std::stoll(m[1]);
    }
  }
  absl::Duration load;
  if (std::regex_search(log, m, std::regex("checkpoint load took (\\S+)")) &&
      absl::ParseDuration(m[1].str(), &load)) {
    out.ckpt_load_s = absl::ToDoubleSeconds(load);
  }
  out.first_step_s = restarted - out.ckpt_load_s;
  out.ok = out.resumed_from >= 0;
  return out;
}

int Main(int argc, char** argv) {
  bench::Report report("recovery_bench", argc, argv);
  if (bench::Quick()) {
    absl::SetFlag(&FLAGS_rounds, 1);
    absl::SetFlag(&FLAGS_steps, 16);
    absl::SetFlag(&FLAGS_every, 4);
    absl::SetFlag(&FLAGS_kill_at, 6);
  }
  e2e::ClusterOptions o;
  o.nodes = 2;
  o.slots = 2;
  o.worker = recovery::Runfile(argv[0], "runtime/worker/ember-worker");
  o.restart_backoff = absl::Seconds(1);  // emberd's default
  recovery::EnterRunfiles(argv[0]);
  auto cluster = e2e::TestCluster::Start(o);
  if (!cluster.ok()) return report.Fail(cluster.status());
  auto c = (*cluster)->Connect(0);
  if (!c.ok()) return report.Fail(c.status());
  const bench::LoadAverage load_begin = bench::ReadLoadAverage();
  WaitFor([&] { auto n = c->Nodes(); return n.ok() && n->size() == 2; }, absl::Seconds(5));
  std::vector<Round> rounds, memory_rounds;
  for (int i = 0; i < absl::GetFlag(FLAGS_rounds); ++i) {
    for (bool replicas : {false, true}) {  // interleaved: disk, memory, disk, memory, ...
      Round r = Measure(*c, i, replicas);
      if (!r.ok) {
        return report.Fail(absl::InternalError(absl::StrCat(
            "round ", i, replicas ? " (replicas)" : "", " failed (the job did not restart, resume or succeed; see stderr)")));
      }
      (replicas ? memory_rounds : rounds).push_back(r);
    }
  }
  std::vector<double> stopped, detect, first, load, lost;
  bench::Table& table = report.AddTable(
      absl::StrFormat("kill -9 of rank 1 at step >= %d: 4 ranks on 2 daemons, checkpoint every "
                      "%d steps",
                      absl::GetFlag(FLAGS_kill_at), absl::GetFlag(FLAGS_every)),
      {"round", "killed at step", "others stopped s", "detect s", "first step s (excl. load)",
       "ckpt load s", "progress lost steps"});
  table.SetLoad(load_begin, bench::ReadLoadAverage());
  for (size_t i = 0; i < rounds.size(); ++i) {
    const Round& r = rounds[i];
    stopped.push_back(r.others_stopped_s);
    detect.push_back(r.detect_s);
    first.push_back(r.first_step_s);
    load.push_back(r.ckpt_load_s);
    lost.push_back(static_cast<double>(r.killed_at - r.resumed_from));
    table.AddRow({static_cast<int>(i), r.killed_at, r.others_stopped_s, r.detect_s,
                  r.first_step_s, r.ckpt_load_s, r.killed_at - r.resumed_from});
  }
  table.AddRow({"median", bench::Cell(), Median(stopped), Median(detect), Median(first),
                Median(load), *std::max_element(lost.begin(), lost.end())});
  const double every = absl::GetFlag(FLAGS_every);
  using bench::Target;
  report.AddTarget(Target::Absolute("kill9_to_others_stopped_s", Median(stopped), 5,
                                    bench::kLowerIsBetter, "s"));
  report.AddTarget(Target::Absolute("kill9_to_restarted_first_step_s_excl_ckpt_load",
                                    Median(first), 15, bench::kLowerIsBetter, "s",
                                    "includes emberd's default 1 s restart backoff"));
  report.AddTarget(Target::Absolute("progress_lost_steps",
                                    *std::max_element(lost.begin(), lost.end()), every,
                                    bench::kLowerIsBetter, "steps", "maximum over rounds"));
  // In-memory replicas every step (interleaved with the rounds above).
  std::vector<double> mfirst, mlost;
  bench::Table& mtable = report.AddTable(
      absl::StrFormat("the same with fault_tolerance: {replicas: memory, every_steps: 1} (in-memory replicas), "
                      "interleaved"),
      {"round", "killed at step", "others stopped s", "detect s", "first step s", "progress lost steps"});
  mtable.SetLoad(load_begin, bench::ReadLoadAverage());
  for (size_t i = 0; i < memory_rounds.size(); ++i) {
    const Round& r = memory_rounds[i];
    mfirst.push_back(r.first_step_s);
    mlost.push_back(static_cast<double>(std::max<int64_t>(0, r.killed_at - r.resumed_from)));
    mtable.AddRow({static_cast<int>(i), r.killed_at, r.others_stopped_s, r.detect_s, r.first_step_s,
                   std::max<int64_t>(0, r.killed_at - r.resumed_from)});
  }
  mtable.AddRow({"median", bench::Cell(), bench::Cell(), bench::Cell(), Median(mfirst),
                 *std::max_element(mlost.begin(), mlost.end())});
  // Goal 0 steps lost, as a higher-is-better fraction (a lower-is-better 0 reads as a failed
  // measurement in bench/report.h): the step resumed from over the step rank 0 had reported at the
  // kill, the least over rounds; 1 = nothing lost.
  double kept = 1e9;
  for (const Round& r : memory_rounds) {
    kept = std::min(kept, std::min(1.0, static_cast<double>(r.resumed_from) / static_cast<double>(r.killed_at)));
  }
  report.AddTarget(Target::Absolute("replicas_progress_kept_fraction", kept, 1.0, bench::kHigherIsBetter, "",
                                    "in-memory replicas every step: step resumed from / step reported at the "
                                    "kill, least over rounds (1 = 0 steps lost)"));
  report.AddTarget(Target::Absolute("replicas_kill9_to_restarted_first_step_s", Median(mfirst), 15,
                                    bench::kLowerIsBetter, "s", "includes emberd's default 1 s restart backoff"));
  return report.Finish();
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "recovery_bench");
  return ember::Main(argc, argv);
}
