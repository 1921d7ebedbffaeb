#include "runtime/daemon/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "runtime/base/json.h"
#include "runtime/daemon/series.h"

namespace ember::daemon {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

bool IsTerminal(jobs::v1::JobState s) {
  return s == jobs::v1::SUCCEEDED || s == jobs::v1::FAILED || s == jobs::v1::CANCELLED;
}

std::string StateName(jobs::v1::JobState s) {
  return absl::AsciiStrToLower(jobs::v1::JobState_Name(s));
}

// The families of one scrape, in the order first used, with a series budget.
class Families {
 public:
  explicit Families(int max_series) : budget_(max_series) {}

  // A family with no sample yet (its HELP and TYPE lines show regardless).
  void Declare(const std::string& name, const std::string& help, MetricType type) {
    if (index_.count(name) == 0) {
      index_.emplace(name, families_.size());
      families_.push_back(MetricFamily{name, help, type, {}});
    }
  }

  // Adds a sample; false (and counted as dropped) once the budget is spent.
  bool Add(const std::string& name, const std::string& help, MetricType type,
           std::vector<ClientMetric::Label> labels, double value) {
    if (!std::isfinite(value)) return true;  // NaN/Inf: leave the series out this scrape
    if (budget_ <= 0) {
      ++dropped_;
      return false;
    }
    --budget_;
    auto it = index_.find(name);
    if (it == index_.end()) {
      it = index_.emplace(name, families_.size()).first;
      families_.push_back(MetricFamily{name, help, type, {}});
    }
    ClientMetric m;
    m.label = std::move(labels);
    if (type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    families_[it->second].metric.push_back(std::move(m));
    return true;
  }
  int64_t dropped() const { return dropped_; }
  std::vector<MetricFamily>& families() { return families_; }

 private:
  int budget_;
  int64_t dropped_ = 0;
  std::map<std::string, size_t> index_;
  std::vector<MetricFamily> families_;
};

constexpr auto kGauge = MetricType::Gauge;
constexpr auto kCounter = MetricType::Counter;

void AddNode(const MetricsSnapshot& s, Families* f) {
  f->Add("ember_node_cpu_slots", "CPU ranks this node offers", kGauge, {}, s.cpu_slots);
  for (const auto& [kind, n] : s.devices) {
    f->Add("ember_node_devices", "devices this node offers, by kind", kGauge, {{"kind", kind}}, n);
    auto used = s.devices_in_use.find(kind);
    f->Add("ember_node_devices_in_use", "devices held by running attempts on this node, by kind",
           kGauge, {{"kind", kind}}, used == s.devices_in_use.end() ? 0 : used->second);
  }
  f->Add("ember_node_memory_total_bytes", "MemTotal of /proc/meminfo", kGauge, {},
         static_cast<double>(s.memory_total_bytes));
  f->Add("ember_node_memory_available_bytes", "MemAvailable of /proc/meminfo", kGauge, {},
         static_cast<double>(s.memory_available_bytes));
  f->Add("ember_node_nvml", "1 when NVML (GPU telemetry) is loaded", kGauge, {}, s.nvml ? 1 : 0);
  // GPU telemetry under the names of NVIDIA's DCGM exporter (units as DCGM: MiB, W, C, MHz).
  for (const GpuSample& g : s.gpus) {
    // DCGM's exporter labels these UUID, modelName and Hostname; promtool's lint refuses
    // camelCase label names, so: uuid, model_name (the host is Prometheus' `instance`).
    std::vector<ClientMetric::Label> l = {
        {"gpu", std::to_string(g.index)}, {"uuid", g.uuid}, {"model_name", g.name}};
    auto add = [&](const char* name, const char* help, MetricType type, double v, bool have) {
      if (have) f->Add(name, help, type, l, v);
    };
    add("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)", kGauge, g.utilization_pct,
        g.utilization_pct >= 0);
    add("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)", kGauge,
        g.memory_utilization_pct, g.memory_utilization_pct >= 0);
    add("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)", kGauge,
        std::floor(g.memory_used_bytes / 1048576.0), g.memory_used_bytes >= 0);
    add("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)", kGauge,
        std::floor((g.memory_total_bytes - g.memory_used_bytes) / 1048576.0),
        g.memory_used_bytes >= 0 && g.memory_total_bytes >= g.memory_used_bytes);
    add("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)", kGauge, g.power_mw / 1000.0,
        g.power_mw >= 0);
    add("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)", kGauge, g.temperature_c,
        g.temperature_c >= 0);
    add("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)", kGauge, g.sm_clock_mhz,
        g.sm_clock_mhz >= 0);
    // Gauges, not counters as in DCGM: a counter's name must end in _total (lower case) for
    // promtool, and volatile counts restart with the driver anyway.
    add("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors",
        kGauge, static_cast<double>(g.ecc_corrected_volatile), g.ecc_corrected_volatile >= 0);
    add("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors",
        kGauge, static_cast<double>(g.ecc_uncorrected_volatile),
        g.ecc_uncorrected_volatile >= 0);
  }
}

// Cluster-wide job metrics (the scheduler's snapshot): counts by state for every job, and labelled
// series for active jobs and the newest `finished` finished ones.
void AddJobs(const MetricsSnapshot& s, int finished, Families* f) {
  if (!s.leader) return;
  std::map<jobs::v1::JobState, int> by_state;
  for (int st = jobs::v1::PENDING; st <= jobs::v1::CANCELLED; ++st) {
    by_state[static_cast<jobs::v1::JobState>(st)] = 0;
  }
  std::vector<const jobs::v1::Job*> labelled, done;
  for (const jobs::v1::Job& j : s.jobs) {
    ++by_state[j.state()];
    (IsTerminal(j.state()) ? done : labelled).push_back(&j);
  }
  for (const auto& [st, n] : by_state) {
    if (st == jobs::v1::JOB_STATE_UNSPECIFIED) continue;
    f->Add("ember_jobs", "jobs in the store by state (cluster-wide, from the scheduler)", kGauge,
           {{"state", StateName(st)}}, n);
  }
  std::sort(done.begin(), done.end(), [](const jobs::v1::Job* a, const jobs::v1::Job* b) {
    return a->end_unix_ms() > b->end_unix_ms();
  });
  if (static_cast<int>(done.size()) > finished) done.resize(std::max(0, finished));
  labelled.insert(labelled.end(), done.begin(), done.end());
  for (const jobs::v1::Job* j : labelled) {
    const std::vector<ClientMetric::Label> l = {{"job_id", j->id()}};
    f->Add("ember_job_state", "1 for the job's current state", kGauge,
           {{"job_id", j->id()}, {"state", StateName(j->state())}}, 1);
    f->Add("ember_job_attempts", "attempts started so far", kGauge, l, j->attempts_size());
    f->Add("ember_job_restarts", "attempts after the first (restarts)", kGauge, l,
           std::max(0, j->attempts_size() - 1));
    f->Add("ember_job_world_size", "ranks the job asked for", kGauge, l, j->world_size());
    f->Add("ember_job_steps_target", "optimizer steps the job runs to", kGauge, l,
           static_cast<double>(j->spec().steps()));
  }
}

std::string FieldHelp(const google::protobuf::FieldDescriptor& f) {
  const std::string unit = PrometheusName(f).second != 1 ? " (converted to seconds)" : "";
  return absl::StrCat("jobs.v1.StepMetrics.", f.name(), unit,
                      " of the rank's last report (proto/jobs.proto)");
}

double FieldValue(const jobs::v1::StepMetrics& m, const google::protobuf::FieldDescriptor& f) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection& r = *m.GetReflection();
  switch (f.cpp_type()) {
    case FD::CPPTYPE_INT32: return r.GetInt32(m, &f);
    case FD::CPPTYPE_INT64: return static_cast<double>(r.GetInt64(m, &f));
    case FD::CPPTYPE_UINT32: return r.GetUInt32(m, &f);
    case FD::CPPTYPE_UINT64: return static_cast<double>(r.GetUInt64(m, &f));
    case FD::CPPTYPE_FLOAT: return r.GetFloat(m, &f);
    case FD::CPPTYPE_DOUBLE: return r.GetDouble(m, &f);
    default: return std::nan("");
  }
}

// This node's ranks, from their metrics files: every numeric StepMetrics field the line has.
// Rank 0 also gives the job-level training series.
void AddRanks(const MetricsSnapshot& s, Families* f) {
  const auto& fields = StepMetricFields();
  for (const auto* field : fields) {
    f->Declare(PrometheusName(*field).first, FieldHelp(*field), kGauge);
  }
  for (const LocalRank& r : s.ranks) {
    absl::StatusOr<RankReport> rep = ReadLastRankReport(r.metrics_path);
    if (!rep.ok()) continue;  // not reported yet
    const jobs::v1::StepMetrics& m = rep->metrics;
    const std::vector<ClientMetric::Label> l = {{"job_id", r.job}, {"rank", std::to_string(r.rank)}};
    const google::protobuf::Reflection& refl = *m.GetReflection();
    for (const auto* field : fields) {
      if (!refl.HasField(m, field)) continue;  // not measured
      const auto [name, factor] = PrometheusName(*field);
      f->Add(name, FieldHelp(*field), kGauge, l, FieldValue(m, *field) * factor);
    }
    f->Add("ember_rank_report_age_seconds", "seconds since the rank last reported", kGauge, l,
           rep->age_s);
    for (const jobs::v1::CollectiveBytes& c : m.collective_bytes()) {
      f->Add("ember_rank_collective_bytes", "bytes moved by collectives in the last reported step",
             kGauge,
             {{"job_id", r.job}, {"rank", std::to_string(r.rank)}, {"collective", c.collective()},
              {"dtype", c.dtype()}},
             static_cast<double>(c.bytes()));
    }
    if (r.rank == 0) {
      const std::vector<ClientMetric::Label> j = {{"job_id", r.job}};
      f->Add("ember_job_step", "last optimizer step rank 0 reported", kGauge, j,
             static_cast<double>(m.step()));
      if (m.has_loss()) {
        f->Add("ember_job_loss", "training loss (mean over every rank) at the last report", kGauge,
               j, m.loss());
      }
      if (m.has_tokens_per_s()) {
        f->Add("ember_job_tokens_per_second", "tokens trained per second over every rank", kGauge,
               j, m.tokens_per_s());
      }
    }
  }
}

}  // namespace

std::pair<std::string, double> PrometheusName(const google::protobuf::FieldDescriptor& field) {
  std::string n = field.name();
  double factor = 1;
  if (absl::EndsWith(n, "_per_s")) {
    n = absl::StrCat(n.substr(0, n.size() - 1), "second");
  } else if (absl::EndsWith(n, "_ms")) {
    n = absl::StrCat(n.substr(0, n.size() - 3), "_seconds");
    factor = 1e-3;
  } else if (absl::EndsWith(n, "_s")) {
    n = absl::StrCat(n.substr(0, n.size() - 2), "_seconds");
  }
  return {absl::StrCat("ember_rank_", n), factor};
}

absl::StatusOr<RankReport> ParseRankReport(absl::string_view line) {
  RankReport r;
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;  // a newer worker's fields; the old format's "bytes" object
  auto st = google::protobuf::util::JsonStringToMessage(std::string(line), &r.metrics, o);
  if (!st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics line is not a jobs.v1.StepMetrics in JSON: ", st.ToString()));
  }
  if (!r.metrics.has_step()) return absl::InvalidArgumentError("metrics line has no \"step\"");
  if (r.metrics.collective_bytes_size() == 0 && line.find("\"bytes\":{") != absl::string_view::npos) {
    // The format before StepMetrics: "bytes":{"all_gather":{"bf16":4096},...,
    // "reduce_scatter_promoted":0}.
    absl::StatusOr<json::Value> v = json::Parse(line);
    const json::Value* bytes = v.ok() ? v->Find("bytes") : nullptr;
    if (bytes != nullptr && bytes->is_object()) {
      for (const auto& [collective, by_dtype] : bytes->object()) {
        if (collective == "reduce_scatter_promoted" && by_dtype.is_number()) {
          r.metrics.set_reduce_scatter_promoted_bytes(by_dtype.IntOr(0));
        }
        if (!by_dtype.is_object()) continue;
        for (const auto& [dtype, n] : by_dtype.object()) {
          if (!n.is_number()) continue;
          jobs::v1::CollectiveBytes* c = r.metrics.add_collective_bytes();
          c->set_collective(collective);
          c->set_dtype(dtype);
          c->set_bytes(n.IntOr(0));
        }
      }
    }
  }
  return r;
}

absl::StatusOr<RankReport> ReadLastRankReport(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("no metrics file ", path));
  struct stat st {};
  std::string tail;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    // Lines are a few hundred bytes: 4 KiB almost always holds the last one; else up to 64 KiB.
    for (off_t want : {off_t{4096}, off_t{65536}}) {
      const off_t n = std::min<off_t>(want, st.st_size);
      tail.resize(n);
      ssize_t got = ::pread(fd, tail.data(), n, st.st_size - n);
      tail.resize(got > 0 ? got : 0);
      const size_t end = tail.rfind('\n');
      const bool whole = n == st.st_size;
      if (end == std::string::npos) {
        if (whole) break;
        continue;
      }
      if (whole || (end > 0 && tail.rfind('\n', end - 1) != std::string::npos)) break;
    }
  }
  ::close(fd);
  size_t end = tail.rfind('\n');
  if (end == std::string::npos) return absl::NotFoundError(absl::StrCat(path, " has no line yet"));
  size_t begin = end == 0 ? std::string::npos : tail.rfind('\n', end - 1);
  begin = begin == std::string::npos ? 0 : begin + 1;
  absl::StatusOr<RankReport> r = ParseRankReport(absl::string_view(tail).substr(begin, end - begin));
  if (!r.ok()) return r.status();
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  r->age_s = std::max(0.0, static_cast<double>(now.tv_sec - st.st_mtim.tv_sec) +
                               (now.tv_nsec - st.st_mtim.tv_nsec) * 1e-9);
  return r;
}

MetricsExporter::MetricsExporter(MetricsOptions options)
    : options_(options), registry_(std::make_shared<prometheus::Registry>()) {
  auto& ops = prometheus::BuildHistogram()
                  .Name("ember_store_op_duration_seconds")
                  .Help("latency of the daemon's store operations")
                  .Register(*registry_);
  const prometheus::Histogram::BucketBoundaries buckets = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                           0.025,  0.05,  0.1,    0.25,  0.5,
                                                           1,      2.5,   5,      10};
  for (const char* op : {"heartbeat", "read_jobs", "other"}) {
    store_ops_[op] = &ops.Add({{"op", op}}, buckets);
  }
  worker_starts_ = &prometheus::BuildCounter()
                        .Name("ember_daemon_worker_starts_total")
                        .Help("worker processes this daemon started")
                        .Register(*registry_)
                        .Add({});
  restarts_ = &prometheus::BuildCounter()
                   .Name("ember_daemon_restarts_total")
                   .Help("jobs this daemon, as the scheduler, moved to RESTARTING")
                   .Register(*registry_)
                   .Add({});
  scrapes_ = &prometheus::BuildCounter()
                  .Name("ember_metrics_scrapes_total")
                  .Help("renders of /metrics")
                  .Register(*registry_)
                  .Add({});
  scrape_cpu_ = &prometheus::BuildCounter()
                     .Name("ember_metrics_scrape_cpu_seconds_total")
                     .Help("CPU time spent rendering /metrics (thread time)")
                     .Register(*registry_)
                     .Add({});
}

MetricsExporter::~MetricsExporter() = default;

void MetricsExporter::ObserveStoreOp(absl::string_view op, double seconds) {
  auto it = store_ops_.find(std::string(op));
  (it == store_ops_.end() ? store_ops_["other"] : it->second)->Observe(seconds);
}

void MetricsExporter::CountWorkerStart() { worker_starts_->Increment(); }
void MetricsExporter::CountRestart() { restarts_->Increment(); }

std::string MetricsExporter::Render(const MetricsSnapshot& s) {
  const double cpu0 = ThreadCpuSeconds();
  Families f(options_.max_series);
  AddNode(s, &f);
  f.Add("ember_daemon_workers", "live worker processes on this node", kGauge, {}, s.workers);
  f.Add("ember_daemon_leader", "1 when this daemon is the scheduler", kGauge, {}, s.leader);
  f.Add("ember_daemon_snapshot_ok", "0 when a store read of this scrape failed", kGauge, {},
        s.snapshot_error.empty() ? 1 : 0);
  AddJobs(s, options_.finished_jobs, &f);
  AddRanks(s, &f);
  std::vector<MetricFamily> families = registry_->Collect();
  for (MetricFamily& m : f.families()) families.push_back(std::move(m));
  MetricFamily dropped{"ember_metrics_series_dropped",
                       "series left out of this scrape by the series cap", kGauge, {}};
  dropped.metric.emplace_back();
  dropped.metric.back().gauge.value = static_cast<double>(f.dropped());
  families.push_back(std::move(dropped));
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  scrapes_->Increment();
  scrape_cpu_->Increment(std::max(0.0, ThreadCpuSeconds() - cpu0));
  return out.str();
}

}  // namespace ember::daemon
