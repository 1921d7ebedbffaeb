// Metric series of a job's ranks, read from the worker's <job_dir>/metrics/rank-<r>.jsonl (one JSON
// object per logged step: jobs.v1.StepMetrics in protobuf's JSON form, written by
// runtime/worker/step_io.cc), downsampled in bounded memory so that a 100k-step job is a few
// thousand points that still show every spike (min and max per bucket). The metrics are the
// numeric fields of StepMetrics, found through its descriptor: a new field is a new series with no
// change here. Lines of the format before StepMetrics (plain JSON numbers, "bytes" object) read
// the same way.
//
//   SeriesReader reader;                                    // one per daemon
//   ASSIGN_OR_RETURN(Downsampled d, reader.Read(path, "loss", /*attempt=*/-1, 1000));
//   for (const Bucket& b : d.buckets) ... b.last_step, b.last, b.min, b.max ...
//
// Bounds: a Downsampler keeps at most `capacity` buckets whatever the number of points; the
// reader caches one Downsampler per metric for each (file, attempt), at most kMaxCachedFiles of
// them (about 110 KiB per metric present in the file, at most), reads every metric in one pass and only what was appended
// since the last call (a file that shrank or was replaced is read again).
// Thread-safety: Downsampler is thread-compatible; SeriesReader is thread-safe.
#ifndef EMBER_RUNTIME_DAEMON_SERIES_H_
#define EMBER_RUNTIME_DAEMON_SERIES_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/descriptor.h"

namespace ember::daemon {

// The metric names a metrics line has, canonical ("step_time" -> "step_s", "comm_wait" ->
// "comm_wait_s", "memory" -> "peak_rss_bytes"; "" -> "loss"). InvalidArgument listing the
// accepted names for anything else.
absl::StatusOr<std::string> CanonicalMetric(absl::string_view name);

// The metrics a series can be read for: every singular numeric field of jobs.v1.StepMetrics
// (proto/jobs.proto), by field name, in field-number order; MetricIndex of one (-1 when not one).
const std::vector<std::string>& MetricNames();
int NumMetrics();
int MetricIndex(absl::string_view canonical);
// The same fields' descriptors (MetricNames()[i] is StepMetricFields()[i]->name()).
const std::vector<const google::protobuf::FieldDescriptor*>& StepMetricFields();

// One metrics line's top-level numbers (nested objects and arrays are skipped). A number may be a
// JSON number, null (NaN) or a string holding one (protobuf's JSON form of int64, "NaN").
struct MetricsLine {
  bool has_step = false, has_attempt = false;
  int64_t step = 0;
  int attempt = 0;
  std::vector<char> has;      // NumMetrics() entries
  std::vector<double> value;  // NaN for null
};
// One pass over `line`; false when it has no "step".
bool ParseMetricsLine(absl::string_view line, MetricsLine* out);

// The number after "key": in one metrics line (top level or not: the keys of a metrics line are
// unique), nullopt when absent; NaN for null.
std::optional<double> LineNumber(absl::string_view line, absl::string_view key);

// Logged steps first_step..last_step, aligned to the downsampler's bucket width.
struct Bucket {
  int64_t first_step = 0, last_step = 0;
  double min = 0, max = 0, last = 0;  // `last`: the value of the latest point added
  int64_t count = 0;
};

// Buckets of 2^k consecutive steps; when more than `capacity` are non-empty, k grows by one and
// neighbours merge. Points may come in any step order; a repeated step (a resumed attempt) merges
// into its bucket and becomes its `last` when it is the bucket's newest step. NaN values are
// dropped (counted in `dropped`).
class Downsampler {
 public:
  explicit Downsampler(int capacity = 4096);
  void Add(int64_t step, double value);
  // At most max(max_points, 1) buckets in step order (neighbours merged as above when needed).
  std::vector<Bucket> Buckets(int max_points) const;
  int64_t points() const { return points_; }
  int64_t dropped() const { return dropped_; }
  int64_t width() const { return width_; }

 private:
  using Keyed = std::vector<std::pair<int64_t, Bucket>>;  // sorted by key
  static void Merge(Bucket* into, const Bucket& from);
  static Keyed Coarsen(const Keyed& in);

  int capacity_;
  int64_t width_ = 1;
  int64_t points_ = 0, dropped_ = 0;
  Keyed buckets_;  // key: step / width_ (floor)
};

struct Downsampled {
  std::vector<Bucket> buckets;
  int64_t lines = 0;    // metrics lines that had the metric (and matched the attempt)
  bool missing = false; // the file does not exist
};

// Per-rank recent behaviour from the last lines of a metrics file (the current attempt's only).
struct RecentStats {
  int64_t step = -1;           // last logged step (-1: nothing logged)
  int lines = 0;               // lines averaged (at most the `lines` asked for)
  double step_s = 0;           // mean step time over those lines
  double comm_wait_s = 0;      // mean time in collectives
  double busy_s = 0;           // mean of step_s - comm_wait_s: what the rank itself spent
  double peak_rss_bytes = 0;   // latest
  double tokens_per_s = 0;     // latest
  double loss = 0;             // latest
};

// Reads at most the last 256 KiB of `path`. NotFound when there is no such file.
absl::StatusOr<RecentStats> TailStats(const std::string& path, int lines, int attempt);

// Ranks that straggle: busy time > factor x the (lower) median busy time of the ranks that
// reported, or a last step more than `max_lag` steps behind the furthest rank. Ranks with no
// lines are not stragglers.
std::vector<bool> FindStragglers(const std::vector<RecentStats>& ranks, double factor = 1.5,
                                 int64_t max_lag = 0);

class SeriesReader {
 public:
  static constexpr int kMaxCachedFiles = 32;
  static constexpr int kCapacity = 2048;  // buckets per cached series (max_points is capped to it)

  // The series of `metric` (canonical) in `path`; attempt < 0 = every line. NotFound is not an
  // error: missing = true. InvalidArgument for an unknown metric; I/O errors name the path.
  absl::StatusOr<Downsampled> Read(const std::string& path, const std::string& metric, int attempt,
                                   int max_points) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    absl::Mutex mu;               // one reader per series at a time
    int64_t offset ABSL_GUARDED_BY(mu) = 0;
    uint64_t inode ABSL_GUARDED_BY(mu) = 0;
    std::string partial ABSL_GUARDED_BY(mu);  // an unterminated last line
    std::vector<Downsampler> ds ABSL_GUARDED_BY(mu) =
        std::vector<Downsampler>(NumMetrics(), Downsampler(kCapacity));
    std::vector<int64_t> lines ABSL_GUARDED_BY(mu) = std::vector<int64_t>(NumMetrics(), 0);
  };
  using Key = std::pair<std::string, int>;  // path, attempt (-1 = every one)

  absl::Mutex mu_;
  std::map<Key, std::shared_ptr<Entry>> cache_ ABSL_GUARDED_BY(mu_);
  std::list<Key> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
};

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_SERIES_H_
