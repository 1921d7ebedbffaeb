// metrics_bench: the daemon-side cost of /metrics with 64 simulated ranks (issue 21).
//
// What runs is what emberd runs per scrape: MetricsExporter::Render over a snapshot of 64 local
// ranks (each with a rank-<r>.jsonl of real-format lines, appended to between scrapes as workers
// do) and 101 job records (1 running, 100 finished; the scheduler's view), served by
// base::HttpServer and fetched over loopback. Not included: the scheduler's store read of the job
// records (one ListKeys + MultiGet; emberd exports its latency as
// ember_store_op_duration_seconds{op="read_jobs"}).
//
// Measured: (1) Prometheus-like 1 s scrapes for --seconds: the process CPU less the client
// thread's (which fetches and appends the lines), over wall time = the share of one core the
// server side costs; (2) a burst of back-to-back scrapes: CPU per scrape and RSS growth.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/report.h"
#include "runtime/base/flags.h"
#include "runtime/base/http_client.h"
#include "runtime/base/http_server.h"
#include "runtime/daemon/metrics.h"

ABSL_FLAG(int, ranks, 64, "simulated local ranks");
ABSL_FLAG(int, seconds, 20, "duration of the 1 s scrape phase");
ABSL_FLAG(int, burst, 500, "back-to-back scrapes of the burst phase");

namespace {

using ember::daemon::LocalRank;
using ember::daemon::MetricsSnapshot;

double ProcessCpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double ThreadCpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int64_t RssKiB() {
  std::ifstream f("/proc/self/status");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key) {
    if (key == "VmRSS:") {
      f >> kb;
      return kb;
    }
    std::getline(f, unit);
  }
  return -1;
}

// A jobs.v1.StepMetrics line as the worker writes it (protobuf's JSON form: int64 as strings).
std::string Line(int64_t step, int rank) {
  return absl::StrCat(
      "{\"step\":\"", step, "\",\"loss\":", 5.0 - step * 1e-4, ",\"local_loss\":", 5.0 + rank * 1e-3,
      ",\"lr\":0.0003,\"grad_norm\":0.91,\"tokens_per_s\":123456,\"step_s\":0.21,"
      "\"comm_wait_s\":0.04,\"peak_rss_bytes\":\"1234567890\",\"state_bytes\":\"987654321\","
      "\"comm_memory_bytes\":\"11536512\",\"collective_bytes\":[{\"collective\":\"all_gather\","
      "\"dtype\":\"bf16\",\"bytes\":\"33554432\"},{\"collective\":\"reduce_scatter\",\"dtype\":"
      "\"f32\",\"bytes\":\"67108864\"},{\"collective\":\"all_reduce\",\"dtype\":\"f32\",\"bytes\":"
      "\"1024\"}],\"reduce_scatter_promoted_bytes\":\"0\",\"checkpoint_save_s\":2.5,"
      "\"flight_entries\":\"2000\",\"attempt\":0,\"unix_ms\":\"1796659056431\"}\n");
}

}  // namespace

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "metrics_bench");
  ember::bench::Report report("metrics_bench", argc, argv);
  const bool quick = ember::bench::Quick();
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int seconds = quick ? 3 : absl::GetFlag(FLAGS_seconds);
  const int burst = quick ? 50 : absl::GetFlag(FLAGS_burst);

  char tmpl[] = "/tmp/metrics_bench_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return report.Fail(absl::InternalError("mkdtemp failed"));
  const std::string dir = tmpl;
  MetricsSnapshot snap;
  snap.node = "bench";
  snap.leader = true;
  snap.cpu_slots = ranks;
  snap.devices = {{"cpu", ranks}};
  snap.devices_in_use = {{"cpu", ranks}};
  snap.workers = ranks;
  int64_t step = 1000;
  std::vector<std::ofstream> files;
  for (int r = 0; r < ranks; ++r) {
    std::string path = absl::StrCat(dir, "/rank-", r, ".jsonl");
    files.emplace_back(path);
    for (int64_t s = 1; s <= step; ++s) files.back() << Line(s, r);  // history: tails are read
    files.back().flush();
    snap.ranks.push_back(LocalRank{"job-bench", 1, r, path});
  }
  for (int j = 0; j <= 100; ++j) {
    ember::jobs::v1::Job job;
    job.set_id(absl::StrCat("job-", j));
    job.set_state(j == 0 ? ember::jobs::v1::RUNNING : ember::jobs::v1::SUCCEEDED);
    job.set_world_size(ranks);
    job.set_end_unix_ms(j);
    job.add_attempts();
    snap.jobs.push_back(job);
  }
  ember::daemon::MetricsExporter exporter({});
  auto server = ember::base::HttpServer::Start({});
  if (!server.ok()) return report.Fail(server.status());
  (*server)->Handle("/metrics", [&](const ember::base::HttpRequest&) {
    ember::base::HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = exporter.Render(snap);
    return r;
  });
  const std::string addr = (*server)->address();
  size_t body_bytes = 0;
  int64_t samples = 0;
  auto scrape = [&]() -> absl::Status {
    auto r = ember::base::HttpFetch(addr, {.path = "/metrics"});
    if (!r.ok()) return r.status();
    if (r->status != 200) return absl::InternalError(absl::StrCat("HTTP ", r->status));
    body_bytes = r->body.size();
    samples = 0;
    for (size_t i = 0; i < r->body.size(); i = r->body.find('\n', i) + 1) {
      if (r->body[i] != '#') ++samples;
      if (r->body.find('\n', i) == std::string::npos) break;
    }
    return absl::OkStatus();
  };
  if (absl::Status s = scrape(); !s.ok()) return report.Fail(s);  // warm-up

  // (1) 1 s scrapes, the workers appending a line per rank per second meanwhile.
  const ember::bench::LoadAverage load0 = ember::bench::ReadLoadAverage();
  double proc0 = ProcessCpu(), mine0 = ThreadCpu();
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < seconds; ++i) {
    ++step;
    for (int r = 0; r < ranks; ++r) files[r] << Line(step, r) << std::flush;
    if (absl::Status s = scrape(); !s.ok()) return report.Fail(s);
    absl::SleepFor(t0 + absl::Seconds(i + 1) - absl::Now());
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  const double server_cpu = (ProcessCpu() - proc0) - (ThreadCpu() - mine0);
  const double share = server_cpu / wall;
  const ember::bench::LoadAverage load1 = ember::bench::ReadLoadAverage();

  // (2) A burst of back-to-back scrapes: CPU per scrape and RSS growth.
  const int64_t rss0 = RssKiB();
  proc0 = ProcessCpu();
  mine0 = ThreadCpu();
  const absl::Time b0 = absl::Now();
  for (int i = 0; i < burst; ++i) {
    if (absl::Status s = scrape(); !s.ok()) return report.Fail(s);
  }
  const double burst_wall = absl::ToDoubleSeconds(absl::Now() - b0);
  const double per_scrape = ((ProcessCpu() - proc0) - (ThreadCpu() - mine0)) / burst;
  const int64_t rss1 = RssKiB();

  auto& t = report.AddTable(
      "Server-side cost of /metrics (Render + HTTP), 64 simulated ranks, 101 job records",
      {"phase", "scrapes", "wall s", "server CPU s", "CPU ms/scrape", "core share", "samples",
       "body KiB", "RSS growth KiB"});
  t.AddRow({"1 s scrapes", seconds, wall, server_cpu, 1000 * server_cpu / seconds, share,
            samples, static_cast<double>(body_bytes) / 1024, ember::bench::Cell()});
  t.SetLoad(load0, load1);
  t.AddRow({"burst", burst, burst_wall, per_scrape * burst, 1000 * per_scrape,
            ember::bench::Cell(), samples, static_cast<double>(body_bytes) / 1024,
            static_cast<int64_t>(rss1 - rss0)});
  t.AddNote("server CPU = process CPU less the client thread's (fetch + appending the lines)");
  report.AddTarget(ember::bench::Target::Absolute(
      "metrics_core_share_64_ranks_1s_scrapes", share, 0.01, ember::bench::kLowerIsBetter,
      "fraction of one core", "issue 21: < 1% of one core at 64 ranks and 1 s scrapes"));
  report.AddTarget(ember::bench::Target::Absolute(
      "metrics_cpu_per_scrape_64_ranks", 1000 * per_scrape, 10, ember::bench::kLowerIsBetter,
      "ms", "10 ms per scrape = 1% of a core at 1 s scrapes"));
  report.AddTarget(ember::bench::Target::Absolute(
      "metrics_rss_growth_over_burst", static_cast<double>(rss1 - rss0), 1024,
      ember::bench::kLowerIsBetter, "KiB", absl::StrCat("over ", burst, " scrapes")));
  report.SetMeta("ranks", ember::json::Value::Int(ranks));
  report.SetMeta("series", ember::json::Value::Int(samples));
  for (int r = 0; r < ranks; ++r) std::remove(snap.ranks[r].metrics_path.c_str());
  rmdir(dir.c_str());
  return report.Finish();
}
