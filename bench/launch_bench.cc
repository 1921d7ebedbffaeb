// launch_bench: what the launcher itself costs.
//
//   bazel run -c opt //bench:launch_bench -- [--json] [--quick] [--reps=3] [--worker=PATH]
//       [--spec=JOB.yaml]
//
// submit_to_first_step_s  Submit of a 4-rank job on a standalone (in-process) cluster until rank 0
//                         reports step 1. With the default stand-in worker (tests/e2e:test_worker)
//                         this is pure launch overhead; with --worker ember-worker and --spec
//                         examples/tiny-gpt.yaml it includes model start-up.
// cancel_to_all_gone_s    Cancel of a running 4-rank job until no process with its EMBER_JOB_ID
//                         is left.
// daemon_cpu_pct_per_worker, daemon_rss_kib_per_worker
//                         The daemon's own CPU (this process: store + daemon threads, not the
//                         workers) and resident memory growth while supervising 4 workers for 3 s,
//                         divided by 4.
// Each latency is the median of --reps runs (default 3; --quick: 1 run, 1 s of supervision).
// All targets are absolute (no peer).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/report.h"
#include "launcher/client.h"
#include "launcher/standalone.h"
#include "runtime/base/flags.h"
#include "runtime/daemon/process.h"
#include "yaml-cpp/yaml.h"

ABSL_FLAG(int, reps, 3, "submit/cancel repetitions (median reported); --quick: 1");
ABSL_FLAG(std::string, worker, "", "worker binary (default: tests/e2e:test_worker)");
ABSL_FLAG(std::string, spec, "", "job spec to submit (default: a 4-rank stand-in job)");

namespace {

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

long RssKib() {
  std::ifstream f("/proc/self/status");
  std::string k;
  long v = 0;
  while (f >> k) {
    if (k == "VmRSS:") {
      f >> v;
      return v;
    }
  }
  return 0;
}

using ember::bench::Median;

std::string Spec(const std::string& name, int steps) {
  return absl::StrCat("name: ", name, "\nmodel: {n_layers: 1, d_model: 32, n_heads: 2, ",
                      "context_length: 16}\nparallelism: {strategy: fsdp, world_size: 4}\nsteps: ",
                      steps, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "launch_bench");
  ember::bench::Report report("launch_bench", argc, argv);
  const bool quick = ember::bench::Quick();
  const int reps = quick ? 1 : std::max(1, absl::GetFlag(FLAGS_reps));
  const absl::Duration supervise = quick ? absl::Seconds(1) : absl::Seconds(3);
  std::string worker = absl::GetFlag(FLAGS_worker), spec_path = absl::GetFlag(FLAGS_spec);
  if (worker.empty()) {
    for (std::string c : {std::string("tests/e2e/test_worker"),
                          absl::StrCat(argv[0], ".runfiles/ember/tests/e2e/test_worker")}) {
      if (access(c.c_str(), X_OK) == 0) worker = c;
    }
  }
  std::string first_spec = Spec("bench-first", 1000000);
  std::map<std::string, std::string> files;
  if (!spec_path.empty()) {
    std::ifstream f(spec_path);
    first_spec.assign(std::istreambuf_iterator<char>(f), {});
    // Upload the data file the spec names relative to itself (as emberctl does).
    YAML::Node root = YAML::Load(first_spec);
    for (const char* key : {"path", "text_path"}) {
      if (!root["data"] || !root["data"][key]) continue;
      std::string rel = root["data"][key].as<std::string>();
      std::string dir = spec_path.substr(0, spec_path.rfind('/') + 1);
      std::ifstream in(dir + rel, std::ios::binary);
      files[rel].assign(std::istreambuf_iterator<char>(in), {});
    }
  }
  ember::StandaloneOptions so;
  so.work_root = absl::StrCat(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", "/launch-bench-", getpid());
  so.worker_binary = worker;
  so.ranks = 4;
  auto cluster = ember::StandaloneCluster::Start(so, first_spec);
  if (!cluster.ok()) return report.Fail(cluster.status());
  auto c = (*cluster)->Connect();
  if (!c.ok()) return report.Fail(c.status());
  const ember::bench::LoadAverage load_begin = ember::bench::ReadLoadAverage();
  std::vector<double> first_step, gone;
  double cpu_pct = 0, rss_kib = 0;
  for (int rep = 0; rep < reps; ++rep) {
    long rss0 = RssKib();
    absl::Time t0 = absl::Now();
    auto r = c->Submit(first_spec, "", files);
    if (!r.ok()) return report.Fail(r.status());
    std::string id = r->job().id();
    bool started = false;
    while (absl::Now() - t0 < absl::Seconds(120)) {
      auto j = c->Get(id);
      if (j.ok() && j->progress().metrics().step() >= 1) {
        started = true;
        break;
      }
      if (j.ok() && ember::IsTerminalState(j->state())) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (!started) {
      return report.Fail(absl::DeadlineExceededError(
          absl::StrCat("job ", id, " never reported step 1 within 120 s")));
    }
    first_step.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    if (rep == 0) {  // steady-state supervision cost
      double cpu0 = CpuSeconds();
      absl::Time w0 = absl::Now();
      absl::SleepFor(supervise);
      double wall = absl::ToDoubleSeconds(absl::Now() - w0);
      cpu_pct = 100.0 * (CpuSeconds() - cpu0) / wall / 4;
      rss_kib = std::max(0L, RssKib() - rss0) / 4.0;
    }
    absl::Time c0 = absl::Now();
    if (auto s = c->Cancel(id); !s.ok()) return report.Fail(s.status());
    while (!ember::daemon::FindJobProcesses(id).empty() && absl::Now() - c0 < absl::Seconds(30)) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (!ember::daemon::FindJobProcesses(id).empty()) {
      return report.Fail(absl::DeadlineExceededError(
          absl::StrCat("processes of job ", id, " still alive 30 s after cancel")));
    }
    gone.push_back(absl::ToDoubleSeconds(absl::Now() - c0));
    (void)c->Wait(id, absl::Seconds(10));
    absl::SleepFor(absl::Milliseconds(300));  // devices released before the next placement
  }
  ember::bench::Table& t = report.AddTable(
      absl::StrCat("launcher, 4-rank job on a standalone cluster: median of ", reps, " runs"),
      {"measurement", "value", "unit"});
  t.SetLoad(load_begin, ember::bench::ReadLoadAverage());
  t.AddNote("worker: " + worker);
  t.AddRow({"submit to first step", Median(first_step), "s"});
  t.AddRow({"cancel to all processes gone", Median(gone), "s"});
  t.AddRow({absl::StrCat("daemon CPU per worker (", absl::FormatDuration(supervise), ")"), cpu_pct,
            "%"});
  t.AddRow({"daemon RSS growth per worker", rss_kib, "KiB"});
  using ember::bench::Target;
  const bool lower = ember::bench::kLowerIsBetter;
  report.AddTarget(Target::Absolute("submit_to_first_step_s", Median(first_step), 2.0, lower, "s"));
  report.AddTarget(Target::Absolute("cancel_to_all_gone_s", Median(gone), 5.0, lower, "s"));
  report.AddTarget(Target::Absolute("daemon_cpu_pct_per_worker", cpu_pct, 1.0, lower, "%"));
  report.AddTarget(Target::Absolute("daemon_rss_kib_per_worker", rss_kib, 1024, lower, "KiB"));
  report.SetMeta("worker", ember::json::Value::Str(worker));
  return report.Finish();
}
