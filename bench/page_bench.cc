// page_bench: how long the job page of a long job takes to show its curves in Chromium.
//
//   bazel run -c opt //bench:page_bench -- [--json] [--quick] [--steps=100000] [--reps=3]
//       [--chromium=/usr/bin/chromium]
//
// A standalone cluster (in-process store + daemon, the job page on loopback) runs a short 2-rank
// stand-in job (tests/e2e:test_worker); then each rank's metrics file is replaced by a synthetic
// one of --steps lines (the worker's format: loss decaying with noise and spikes, tokens/s, step
// time, comm wait). Headless Chromium loads /jobs/<id> with --dump-dom; the page writes
// body[data-rendered-ms] = performance.now() when both curves are drawn (time since navigation
// start, Chromium's own clock) and body[data-response-ms] when the document had arrived.
//
// page_load_cold_ms   the first load: the daemon reads and downsamples 2 ranks x 2 metrics x
//                     --steps lines (nothing cached)
// page_load_warm_ms   the median of --reps later loads (the series reader's cache holds the files'
//                     buckets; nothing new was appended)
// points_per_curve    points one rank's loss curve holds in the page (the downsampled series)
// server_cold_cpu_ms  the daemon's CPU time for GET of the page document (data inline), nothing
//                     cached: what the page costs the daemon, independent of the machine's load
// Goals: both loads < 1000 ms, <= 2000 points per curve. Absolute targets (no peer). Chromium's
// own start-up (process launch, profile) is outside navigation and not counted; the bench also
// reports the whole `chromium --dump-dom` wall time in the table.
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/report.h"
#include "launcher/client.h"
#include "launcher/standalone.h"
#include "runtime/base/files.h"
#include "runtime/base/flags.h"
#include "runtime/base/http_client.h"

ABSL_FLAG(int, steps, 100000, "logged steps per rank in the synthetic metrics files (--quick: 10000)");
ABSL_FLAG(int, reps, 3, "warm page loads (median reported)");
ABSL_FLAG(std::string, chromium, "/usr/bin/chromium", "headless Chromium");

namespace {

// The worker's metrics line (runtime/worker/step_io.cc), synthetic values.
void WriteMetrics(const std::string& path, int steps, int rank) {
  std::mt19937 rng(rank + 1);
  std::normal_distribution<double> noise(0, 1);
  std::ofstream f(path, std::ios::trunc);
  char line[1024];
  for (int s = 1; s <= steps; ++s) {
    double loss = 1.5 + 4 * std::exp(-s / (0.2 * steps)) + 0.05 * noise(rng);
    if (s % 9973 == 0) loss += 3;  // a spike the downsampled curve must keep
    const double step_s = 0.1 + 0.005 * std::fabs(noise(rng));
    std::snprintf(line, sizeof line,
                  // A jobs.v1.StepMetrics line as the worker writes it (int64 as strings).
                  "{\"step\":\"%d\",\"loss\":%.17g,\"local_loss\":%.17g,\"lr\":0.001,\"grad_norm\":1.1,"
                  "\"tokens_per_s\":%.17g,\"step_s\":%.9g,\"comm_wait_s\":%.9g,"
                  "\"peak_rss_bytes\":\"123456789\",\"state_bytes\":\"4096\","
                  "\"comm_memory_bytes\":\"11536512\",\"collective_bytes\":[{\"collective\":"
                  "\"all_gather\",\"dtype\":\"f32\",\"bytes\":\"86400\"},{\"collective\":"
                  "\"reduce_scatter\",\"dtype\":\"f32\",\"bytes\":\"86400\"},{\"collective\":"
                  "\"all_reduce\",\"dtype\":\"f64\",\"bytes\":\"16\"}],"
                  "\"reduce_scatter_promoted_bytes\":\"0\",\"flight_entries\":\"12\","
                  "\"attempt\":0,\"unix_ms\":\"%lld\"}\n",
                  s, loss, loss, 64 * 32 / step_s, step_s, 0.3 * step_s,
                  1700000000000LL + 100LL * s);
    f << line;
  }
}

double CpuMs() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return 1e3 * (u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

struct Load {
  double rendered_ms = -1, response_ms = -1, wall_ms = -1;
  int points = -1;
};

absl::StatusOr<Load> LoadPage(const std::string& chromium, const std::string& url,
                              const std::string& profile, bool want_curve = true) {
  const std::string cmd = absl::StrCat(
      "HOME=", profile, " timeout 120 ", chromium, " --headless=new --no-sandbox --disable-gpu ",
      "--no-first-run --user-data-dir=", profile, " --dump-dom '", url, "' 2>/dev/null");
  const absl::Time t0 = absl::Now();
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return absl::InternalError("popen " + chromium);
  std::string dom;
  char buf[65536];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) dom.append(buf, n);
  const int rc = pclose(p);
  Load l;
  l.wall_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  if (rc != 0) return absl::InternalError(absl::StrCat(chromium, " exited ", rc, " for ", url));
  std::smatch m;
  if (std::regex_search(dom, m, std::regex("data-rendered-ms=\"([0-9.]+)\""))) l.rendered_ms = std::stod(m[1]);
  if (std::regex_search(dom, m, std::regex("data-response-ms=\"([0-9.]+)\""))) l.response_ms = std::stod(m[1]);
  if (std::regex_search(dom, m, std::regex("id=\"chart-loss\"[^>]*data-points=\"([0-9]+)\""))) {
    l.points = std::stoi(m[1]) / 2;  // two ranks
  }
  if (want_curve && (l.rendered_ms < 0 || l.points <= 0)) {
    return absl::InternalError(absl::StrCat("the page at ", url, " drew no curve (",
                                            dom.size(), " bytes of DOM)"));
  }
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "page_bench");
  ember::bench::Report report("page_bench", argc, argv);
  const bool quick = ember::bench::Quick();
  const int steps = quick ? 10000 : absl::GetFlag(FLAGS_steps);
  const int reps = quick ? 1 : std::max(1, absl::GetFlag(FLAGS_reps));
  const std::string chromium = absl::GetFlag(FLAGS_chromium);
  if (access(chromium.c_str(), X_OK) != 0) {
    return report.Fail(absl::NotFoundError(absl::StrCat(
        chromium, " is not there: install Debian's chromium (deploy/install-deps.sh) or pass "
        "--chromium")));
  }
  std::string worker;
  for (std::string c : {std::string("tests/e2e/test_worker"),
                        absl::StrCat(argv[0], ".runfiles/ember/tests/e2e/test_worker")}) {
    if (access(c.c_str(), X_OK) == 0) worker = c;
  }
  const std::string tmp = absl::StrCat(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
                                       "/page-bench-", getpid());
  const std::string spec = "name: page-bench\nmodel: {n_layers: 1, d_model: 32, n_heads: 2, "
                           "context_length: 16}\nparallelism: {strategy: fsdp, world_size: 2}\n"
                           "steps: 3\n";
  ember::StandaloneOptions so;
  so.work_root = tmp + "/jobs";
  so.worker_binary = worker;
  so.ranks = 2;
  so.http_listen = "127.0.0.1:0";
  auto cluster = ember::StandaloneCluster::Start(so, spec);
  if (!cluster.ok()) return report.Fail(cluster.status());
  auto c = (*cluster)->Connect();
  if (!c.ok()) return report.Fail(c.status());
  // Two jobs with the same synthetic files: one for Chromium, one for the server alone (each
  // first load finds nothing cached).
  std::vector<std::string> ids;
  for (int j = 0; j < 2; ++j) {
    auto sub = c->Submit(spec);
    if (!sub.ok()) return report.Fail(sub.status());
    auto done = c->Wait(sub->job().id(), absl::Seconds(120));
    if (!done.ok()) return report.Fail(done.status());
    for (int r = 0; r < 2; ++r) {
      const std::string dir = absl::StrCat(done->job_dir(), "/metrics");
      if (absl::Status s = ember::base::MakeDirs(dir); !s.ok()) return report.Fail(s);
      WriteMetrics(absl::StrCat(dir, "/rank-", r, ".jsonl"), steps, r);
    }
    ids.push_back(sub->job().id());
  }
  const std::string http = (*cluster)->http_address();
  const std::string url = absl::StrCat("http://", http, "/jobs/", ids[0]);
  const std::string profile = tmp + "/chrome";
  // The server alone: the page document (its data inline) of the other job, cold then warm.
  std::vector<double> server_ms, server_cpu_ms;
  for (int i = 0; i < 2; ++i) {
    const double cpu0 = CpuMs();
    const absl::Time t0 = absl::Now();
    auto r = ember::base::HttpFetch(http, {.path = absl::StrCat("/jobs/", ids[1])});
    if (!r.ok()) return report.Fail(r.status());
    if (r->status != 200) return report.Fail(absl::InternalError(absl::StrCat("page: ", r->status)));
    server_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    server_cpu_ms.push_back(CpuMs() - cpu0);  // this process: the daemon (the test worker is gone)
  }
  // Chromium's first start with a new profile is slow and not the page's doing: warm it up on
  // another page first.
  (void)LoadPage(chromium, absl::StrCat("http://", http, "/login"), profile, /*want_curve=*/false);
  auto& t = report.AddTable(absl::StrFormat("job page of a %d-step, 2-rank job", steps),
                            {"load", "rendered ms", "document ms", "chromium wall ms",
                             "points per curve"});
  const ember::bench::LoadAverage load0 = ember::bench::ReadLoadAverage();
  auto cold = LoadPage(chromium, url, profile);
  if (!cold.ok()) return report.Fail(cold.status());
  t.AddRow({"cold", cold->rendered_ms, cold->response_ms, cold->wall_ms, cold->points});
  std::vector<double> warm;
  int points = cold->points;
  for (int i = 0; i < reps; ++i) {
    auto w = LoadPage(chromium, url, profile);
    if (!w.ok()) return report.Fail(w.status());
    t.AddRow({absl::StrCat("warm ", i + 1), w->rendered_ms, w->response_ms, w->wall_ms, w->points});
    warm.push_back(w->rendered_ms);
    points = std::max(points, w->points);
  }
  t.SetLoad(load0, ember::bench::ReadLoadAverage());
  auto& st = report.AddTable("the daemon alone: GET /jobs/<id> (document with its data inline)",
                             {"load", "wall ms", "daemon CPU ms"});
  st.AddRow({"cold", server_ms[0], server_cpu_ms[0]});
  st.AddRow({"warm", server_ms[1], server_cpu_ms[1]});
  using ember::bench::Target;
  report.AddTarget(Target::Absolute("page_load_cold_ms", cold->rendered_ms, 1000,
                                    ember::bench::kLowerIsBetter, "ms",
                                    absl::StrCat("navigation to both curves drawn, ", steps,
                                                 " steps x 2 ranks read and downsampled")));
  report.AddTarget(Target::Absolute("page_load_warm_ms", ember::bench::Median(warm), 1000,
                                    ember::bench::kLowerIsBetter, "ms",
                                    absl::StrCat("median of ", reps, " loads, series cached")));
  report.AddTarget(Target::Absolute("server_cold_cpu_ms", server_cpu_ms[0], 500,
                                    ember::bench::kLowerIsBetter, "ms",
                                    absl::StrFormat("the daemon's CPU for a cold page document "
                                                    "(wall %.0f ms at this load)", server_ms[0])));
  report.AddTarget(Target::Absolute("points_per_curve", points, 2000,
                                    ember::bench::kLowerIsBetter, "points",
                                    "one rank's loss curve as drawn (min/max band per bucket)"));
  cluster->reset();
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return report.Finish();
}
