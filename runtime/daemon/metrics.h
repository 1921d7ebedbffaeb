// emberd's Prometheus metrics: what one scrape of /metrics shows, rendered in the text format
// (0.0.4) by prometheus-cpp's TextSerializer. Names, labels and units: docs/operations.md
// "Metrics".
//
//   MetricsExporter exporter({});
//   exporter.ObserveStoreOp("heartbeat", 0.002);          // daemon counters, any thread
//   std::string text = exporter.Render(snapshot);          // one scrape
//
// Sources: the snapshot the daemon takes (node inventory, NVML, this node's ranks, and on the
// scheduler every job record) and, per local rank, the newest line of the rank's metrics file
// <job_dir>/metrics/rank-<r>.jsonl (runtime/worker/step_io.h), read at scrape time (its last few
// KiB). Every numeric field of that line's jobs.v1.StepMetrics is a gauge ember_rank_<field>
// (PrometheusName), found through the message's descriptor, and its family is declared (HELP and
// TYPE) in every scrape even when no rank has it. Labels stay bounded: `job` only for active jobs and the newest `finished_jobs` finished
// ones, `rank` only for ranks running on this node (so < world size), and at most `max_series`
// series per scrape (the rest are dropped and counted in ember_metrics_series_dropped).
//
// Thread-safe: the counters may be updated from any thread while Render runs.
#ifndef EMBER_RUNTIME_DAEMON_METRICS_H_
#define EMBER_RUNTIME_DAEMON_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "proto/jobs.pb.h"
#include "runtime/daemon/nvml.h"

namespace prometheus {
class Registry;
class Counter;
class Histogram;
}  // namespace prometheus

namespace ember::daemon {

// The newest report of one rank: a line of rank-<r>.jsonl.
struct RankReport {
  jobs::v1::StepMetrics metrics;
  double age_s = -1;              // seconds since the file was last written
};

// The /metrics name of a StepMetrics field and the factor its value is multiplied by:
// ember_rank_<name> with a trailing _per_s spelled _per_second, _s spelled _seconds, and _ms
// spelled _seconds (factor 1e-3). docs/operations.md lists them.
std::pair<std::string, double> PrometheusName(const google::protobuf::FieldDescriptor& field);

// Parses one jsonl line (StepMetrics' JSON form; unknown keys are ignored; a line of the format
// before StepMetrics reads too, its "bytes" object included). InvalidArgument naming what is wrong.
absl::StatusOr<RankReport> ParseRankReport(absl::string_view line);
// The last complete line of `path` (looked for in its last 64 KiB), parsed, with age_s from the
// file's mtime. NotFound when the file is missing or holds no complete line yet.
absl::StatusOr<RankReport> ReadLastRankReport(const std::string& path);

// A rank of a running attempt on this node.
struct LocalRank {
  std::string job;
  int attempt = 0;
  int rank = 0;
  std::string metrics_path;  // <job_dir>/metrics/rank-<r>.jsonl
};

// What the daemon knows at scrape time.
struct MetricsSnapshot {
  std::string node;
  bool leader = false;  // cluster-wide job metrics come from the scheduler only (no duplicates)
  int cpu_slots = 0;
  std::map<std::string, int> devices, devices_in_use;  // kind ("cpu"/"cuda") -> count
  int64_t memory_total_bytes = 0, memory_available_bytes = 0;
  bool nvml = false;
  std::vector<GpuSample> gpus;
  int workers = 0;                    // live worker processes on this node
  std::vector<jobs::v1::Job> jobs;    // leader: every job record (else empty)
  std::vector<LocalRank> ranks;       // this node's ranks of running attempts
  std::string snapshot_error;         // a failed store read (the scrape still answers)
};

struct MetricsOptions {
  int finished_jobs = 10;    // finished jobs that keep their job label, newest end time first
  int max_series = 20000;    // snapshot series per scrape; beyond it per-rank series are dropped
};

class MetricsExporter {
 public:
  explicit MetricsExporter(MetricsOptions options);
  ~MetricsExporter();

  // Daemon counters (any thread). `op` is one of "heartbeat", "read_jobs";
  // others count as "other".
  void ObserveStoreOp(absl::string_view op, double seconds);
  void CountWorkerStart();
  void CountRestart();  // the scheduler moved a job to RESTARTING

  // The whole /metrics body for `s`; reads each local rank's metrics file. Also accounts its own
  // CPU time in ember_metrics_scrape_cpu_seconds_total.
  std::string Render(const MetricsSnapshot& s);

 private:
  const MetricsOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::map<std::string, prometheus::Histogram*> store_ops_;
  prometheus::Counter* worker_starts_;
  prometheus::Counter* restarts_;
  prometheus::Counter* scrapes_;
  prometheus::Counter* scrape_cpu_;
};

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_METRICS_H_
