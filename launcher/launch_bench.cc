// launch_bench: what the launcher itself costs.
//
//   bazel run -c opt //launcher:launch_bench -- [--json] [--worker PATH] [--spec JOB.yaml]
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
// Each latency is the median of --reps runs (default 3).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "launcher/client.h"
#include "launcher/standalone.h"
#include "runtime/daemon/process.h"
#include "yaml-cpp/yaml.h"

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

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string Spec(const std::string& name, int steps) {
  return absl::StrCat("name: ", name, "\nmodel: {n_layers: 1, d_model: 32, n_heads: 2, ",
                      "context_length: 16}\nparallelism: {strategy: fsdp, world_size: 4}\nsteps: ",
                      steps, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int reps = 3;
  std::string worker, spec_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a.rfind("--worker=", 0) == 0) worker = a.substr(9);
    else if (a.rfind("--spec=", 0) == 0) spec_path = a.substr(7);
    else if (a.rfind("--reps=", 0) == 0) reps = std::max(1, atoi(a.c_str() + 7));
    else {
      std::cerr << "usage: launch_bench [--json] [--reps=N] [--worker=PATH] [--spec=JOB.yaml]\n";
      return 2;
    }
  }
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
  if (!cluster.ok()) {
    std::cerr << "launch_bench: " << cluster.status() << "\n";
    return 1;
  }
  auto c = (*cluster)->Connect();
  if (!c.ok()) {
    std::cerr << "launch_bench: " << c.status() << "\n";
    return 1;
  }
  std::vector<double> first_step, gone;
  double cpu_pct = 0, rss_kib = 0;
  for (int rep = 0; rep < reps; ++rep) {
    long rss0 = RssKib();
    absl::Time t0 = absl::Now();
    auto r = c->Submit(first_spec, "", files);
    if (!r.ok()) {
      std::cerr << "launch_bench: " << r.status() << "\n";
      return 1;
    }
    std::string id = r->job().id();
    bool started = false;
    while (absl::Now() - t0 < absl::Seconds(120)) {
      auto j = c->Get(id);
      if (j.ok() && j->progress().step() >= 1) {
        started = true;
        break;
      }
      if (j.ok() && ember::IsTerminalState(j->state())) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (!started) {
      std::cerr << "launch_bench: job " << id << " never reported step 1\n";
      return 1;
    }
    first_step.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    if (rep == 0) {  // steady-state supervision cost
      double cpu0 = CpuSeconds();
      absl::Time w0 = absl::Now();
      absl::SleepFor(absl::Seconds(3));
      double wall = absl::ToDoubleSeconds(absl::Now() - w0);
      cpu_pct = 100.0 * (CpuSeconds() - cpu0) / wall / 4;
      rss_kib = std::max(0L, RssKib() - rss0) / 4.0;
    }
    absl::Time c0 = absl::Now();
    (void)c->Cancel(id);
    while (!ember::daemon::FindJobProcesses(id).empty() && absl::Now() - c0 < absl::Seconds(30)) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    gone.push_back(absl::ToDoubleSeconds(absl::Now() - c0));
    (void)c->Wait(id, absl::Seconds(10));
    absl::SleepFor(absl::Milliseconds(300));  // devices released before the next placement
  }
  struct Row { const char* name; double value; double goal; bool higher; const char* unit; };
  Row rows[] = {
      {"submit_to_first_step_s", Median(first_step), 2.0, false, "s"},
      {"cancel_to_all_gone_s", Median(gone), 5.0, false, "s"},
      {"daemon_cpu_pct_per_worker", cpu_pct, 1.0, false, "%"},
      {"daemon_rss_kib_per_worker", rss_kib, 1024, false, "KiB"},
  };
  if (json) {
    std::cout << "{\"benchmark\":\"launch_bench\",\"worker\":\"" << worker << "\",\"targets\":[";
    for (size_t i = 0; i < std::size(rows); ++i) {
      std::cout << (i ? "," : "")
                << absl::StrFormat("{\"name\":\"%s\",\"value\":%.4f,\"peer\":null,\"goal\":%g,"
                                   "\"higher_is_better\":%s,\"unit\":\"%s\"}",
                                   rows[i].name, rows[i].value, rows[i].goal,
                                   rows[i].higher ? "true" : "false", rows[i].unit);
    }
    std::cout << "]}\n";
  } else {
    std::cout << absl::StrFormat("%-28s %10s %8s %s\n", "target", "value", "goal", "unit");
    for (const Row& r : rows) {
      std::cout << absl::StrFormat("%-28s %10.3f %8g %s\n", r.name, r.value, r.goal, r.unit);
    }
  }
  return 0;
}
