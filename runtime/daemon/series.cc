#include "runtime/daemon/series.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/jobs.pb.h"

namespace ember::daemon {
namespace {

int64_t FloorDiv2(int64_t k) { return k >= 0 ? k / 2 : -((-k + 1) / 2); }

absl::Status PosixError(const std::string& what, const std::string& path) {
  const int e = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// Calls fn(line) for each complete line of `text` from `start`; returns where the unterminated
// rest begins.
template <typename Fn>
size_t ForEachLine(const std::string& text, size_t start, Fn fn) {
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    fn(absl::string_view(text).substr(start, nl - start));
  }
  return start;
}

bool AttemptMatches(absl::string_view line, int attempt) {
  if (attempt < 0) return true;
  std::optional<double> a = LineNumber(line, "attempt");
  return a && *a == attempt;
}

// The end of the JSON value starting at line[i] (an object, array, string or scalar).
size_t SkipValue(absl::string_view line, size_t i) {
  int depth = 0;
  bool in_string = false;
  for (; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') { in_string = false; if (depth == 0) return i + 1; }
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') { if (depth == 0) return i; if (--depth == 0) return i + 1; }
    else if (c == ',' && depth == 0) return i;
  }
  return i;
}

// A JSON number, null, or a string holding a number (protobuf's JSON form of int64 and of
// NaN/Infinity).
std::optional<double> ParseNumber(absl::string_view v) {
  if (v.substr(0, 4) == "null") return std::nan("");
  if (!v.empty() && v.front() == '"') {
    v.remove_prefix(1);
    const size_t q = v.find('"');
    if (q == absl::string_view::npos) return std::nullopt;
    v = v.substr(0, q);
    if (v == "NaN") return std::nan("");
    if (v == "Infinity") return HUGE_VAL;
    if (v == "-Infinity") return -HUGE_VAL;
  }
  double d = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc() || end == v.data()) return std::nullopt;
  return d;
}

}  // namespace

const std::vector<const google::protobuf::FieldDescriptor*>& StepMetricFields() {
  static const auto* fields = [] {
    using FD = google::protobuf::FieldDescriptor;
    auto* v = new std::vector<const FD*>;
    const google::protobuf::Descriptor* d = jobs::v1::StepMetrics::descriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const FD* f = d->field(i);
      if (f->is_repeated()) continue;
      switch (f->cpp_type()) {
        case FD::CPPTYPE_INT32: case FD::CPPTYPE_INT64: case FD::CPPTYPE_UINT32:
        case FD::CPPTYPE_UINT64: case FD::CPPTYPE_DOUBLE: case FD::CPPTYPE_FLOAT:
          v->push_back(f);
          break;
        default:
          break;
      }
    }
    std::sort(v->begin(), v->end(), [](const FD* a, const FD* b) { return a->number() < b->number(); });
    return v;
  }();
  return *fields;
}

const std::vector<std::string>& MetricNames() {
  static const auto* names = [] {
    auto* v = new std::vector<std::string>;
    for (const auto* f : StepMetricFields()) v->push_back(f->name());
    return v;
  }();
  return *names;
}

int NumMetrics() { return static_cast<int>(MetricNames().size()); }

int MetricIndex(absl::string_view canonical) {
  static const auto* index = [] {
    auto* m = new absl::flat_hash_map<std::string, int>;
    for (int i = 0; i < NumMetrics(); ++i) (*m)[MetricNames()[i]] = i;
    return m;
  }();
  auto it = index->find(canonical);
  return it == index->end() ? -1 : it->second;
}

bool ParseMetricsLine(absl::string_view line, MetricsLine* out) {
  out->has_step = out->has_attempt = false;
  out->step = 0;
  out->attempt = 0;
  out->has.assign(NumMetrics(), 0);
  out->value.assign(NumMetrics(), 0.0);
  size_t i = line.find('{');
  if (i == absl::string_view::npos) return false;
  ++i;
  while (i < line.size()) {
    const size_t q = line.find('"', i);
    if (q == absl::string_view::npos) break;
    const size_t qe = line.find('"', q + 1);
    if (qe == absl::string_view::npos) break;
    const absl::string_view key = line.substr(q + 1, qe - q - 1);
    size_t v = qe + 1;
    while (v < line.size() && (line[v] == ' ' || line[v] == ':')) ++v;
    const size_t end = SkipValue(line, v);
    const absl::string_view value = line.substr(v, end - v);
    i = end + 1;  // past the ','
    if (value.empty() || value[0] == '{' || value[0] == '[') continue;
    const std::optional<double> d = ParseNumber(value);
    if (!d) continue;
    if (key == "step") {
      out->has_step = std::isfinite(*d);
      out->step = static_cast<int64_t>(*d);
    } else if (key == "attempt") {
      out->has_attempt = true;
      out->attempt = static_cast<int>(*d);
    }
    if (const int m = MetricIndex(key); m >= 0) {
      out->has[m] = 1;
      out->value[m] = *d;
    }
  }
  return out->has_step;
}

absl::StatusOr<std::string> CanonicalMetric(absl::string_view name) {
  if (name.empty()) return std::string("loss");
  if (name == "step_time") return std::string("step_s");
  if (name == "comm_wait") return std::string("comm_wait_s");
  if (name == "memory") return std::string("peak_rss_bytes");
  if (MetricIndex(name) >= 0) return std::string(name);
  return absl::InvalidArgumentError(absl::StrCat(
      "metric: '", name, "' is not one of ", absl::StrJoin(MetricNames(), ", "),
      " (the numeric fields of jobs.v1.StepMetrics, proto/jobs.proto; or the aliases step_time, "
      "comm_wait, memory)"));
}

std::optional<double> LineNumber(absl::string_view line, absl::string_view key) {
  // "key": with the quotes, so "loss" never matches "local_loss" and "step" never "step_s".
  char pattern[64];
  if (key.size() + 3 > sizeof pattern) return std::nullopt;
  pattern[0] = '"';
  std::memcpy(pattern + 1, key.data(), key.size());
  pattern[key.size() + 1] = '"';
  pattern[key.size() + 2] = ':';
  const size_t at = line.find(absl::string_view(pattern, key.size() + 3));
  if (at == absl::string_view::npos) return std::nullopt;
  absl::string_view rest = line.substr(at + key.size() + 3);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (rest.substr(0, 4) == "null") return std::nan("");
  if (!rest.empty() && rest.front() == '"') {  // protobuf's JSON form of int64 and NaN
    rest.remove_prefix(1);
    if (rest.substr(0, 4) == "NaN\"") return std::nan("");
  }
  char buf[40];
  const size_t n = std::min(rest.size(), sizeof buf - 1);
  std::memcpy(buf, rest.data(), n);
  buf[n] = '\0';
  char* end = nullptr;
  const double v = std::strtod(buf, &end);
  if (end == buf) return std::nullopt;
  return v;
}

Downsampler::Downsampler(int capacity) : capacity_(std::max(2, capacity)) {}

void Downsampler::Merge(Bucket* into, const Bucket& from) {
  into->first_step = std::min(into->first_step, from.first_step);
  into->min = std::min(into->min, from.min);
  into->max = std::max(into->max, from.max);
  if (from.last_step >= into->last_step) {
    into->last_step = from.last_step;
    into->last = from.last;
  }
  into->count += from.count;
}

Downsampler::Keyed Downsampler::Coarsen(const Keyed& in) {
  Keyed out;
  out.reserve(in.size() / 2 + 1);
  for (const auto& [k, b] : in) {
    const int64_t key = FloorDiv2(k);
    if (!out.empty() && out.back().first == key) Merge(&out.back().second, b);
    else out.emplace_back(key, b);
  }
  return out;
}

void Downsampler::Add(int64_t step, double value) {
  if (std::isnan(value)) {
    ++dropped_;
    return;
  }
  ++points_;
  const int64_t key = step >= 0 ? step / width_ : -((-step + width_ - 1) / width_);
  const Bucket p{step, step, value, value, value, 1};
  if (buckets_.empty() || buckets_.back().first < key) {  // the usual case: a later step
    buckets_.emplace_back(key, p);
  } else {
    auto it = std::lower_bound(buckets_.begin(), buckets_.end(), key,
                               [](const auto& e, int64_t k) { return e.first < k; });
    if (it != buckets_.end() && it->first == key) Merge(&it->second, p);
    else buckets_.insert(it, {key, p});
  }
  while (static_cast<int>(buckets_.size()) > capacity_) {
    buckets_ = Coarsen(buckets_);
    width_ *= 2;
  }
}

std::vector<Bucket> Downsampler::Buckets(int max_points) const {
  const size_t limit = static_cast<size_t>(std::max(1, max_points));
  Keyed coarse;
  const Keyed* use = &buckets_;
  while (use->size() > limit) {
    coarse = Coarsen(*use);
    use = &coarse;
  }
  std::vector<Bucket> out;
  out.reserve(use->size());
  for (const auto& [k, b] : *use) out.push_back(b);
  return out;
}

absl::StatusOr<RecentStats> TailStats(const std::string& path, int lines, int attempt) {
  constexpr int64_t kTail = 256 << 10;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return PosixError("open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = PosixError("stat", path);
    ::close(fd);
    return s;
  }
  const int64_t from = std::max<int64_t>(0, st.st_size - kTail);
  std::string text(st.st_size - from, '\0');
  const ssize_t got = ::pread(fd, text.data(), text.size(), from);
  ::close(fd);
  if (got < 0) return PosixError("read", path);
  text.resize(got);
  std::vector<absl::string_view> all;
  size_t start = 0;
  if (from > 0) {  // the first line is cut
    start = text.find('\n');
    start = start == std::string::npos ? text.size() : start + 1;
  }
  ForEachLine(text, start, [&](absl::string_view l) {
    if (LineNumber(l, "step")) all.push_back(l);
  });
  RecentStats r;
  if (all.empty()) return r;
  if (attempt < 0) {  // the newest line's attempt
    std::optional<double> a = LineNumber(all.back(), "attempt");
    attempt = a ? static_cast<int>(*a) : -1;
  }
  std::vector<absl::string_view> use;
  for (auto it = all.rbegin(); it != all.rend() && static_cast<int>(use.size()) < lines; ++it) {
    if (AttemptMatches(*it, attempt)) use.push_back(*it);
  }
  if (use.empty()) return r;
  auto num = [](absl::string_view l, const char* k) {
    std::optional<double> v = LineNumber(l, k);
    return v && std::isfinite(*v) ? *v : 0.0;
  };
  r.step = static_cast<int64_t>(num(use.front(), "step"));
  r.peak_rss_bytes = num(use.front(), "peak_rss_bytes");
  r.tokens_per_s = num(use.front(), "tokens_per_s");
  r.loss = num(use.front(), "loss");
  r.lines = static_cast<int>(use.size());
  for (absl::string_view l : use) {
    r.step_s += num(l, "step_s");
    r.comm_wait_s += num(l, "comm_wait_s");
  }
  r.step_s /= r.lines;
  r.comm_wait_s /= r.lines;
  r.busy_s = std::max(0.0, r.step_s - r.comm_wait_s);
  return r;
}

std::vector<bool> FindStragglers(const std::vector<RecentStats>& ranks, double factor,
                                 int64_t max_lag) {
  std::vector<double> busy;
  int64_t furthest = -1;
  for (const RecentStats& r : ranks) {
    if (r.lines == 0) continue;
    busy.push_back(r.busy_s);
    furthest = std::max(furthest, r.step);
  }
  std::vector<bool> out(ranks.size(), false);
  if (busy.size() < 2) return out;
  std::sort(busy.begin(), busy.end());
  const double median = busy[(busy.size() - 1) / 2];
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RecentStats& r = ranks[i];
    if (r.lines == 0) continue;
    out[i] = r.busy_s > factor * median || (max_lag > 0 && furthest - r.step > max_lag);
  }
  return out;
}

absl::StatusOr<Downsampled> SeriesReader::Read(const std::string& path, const std::string& metric,
                                               int attempt, int max_points) {
  const int m = MetricIndex(metric);
  if (m < 0) return CanonicalMetric(metric).status();
  Key key{path, attempt < 0 ? -1 : attempt};
  std::shared_ptr<Entry> e;
  {
    absl::MutexLock l(&mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      e = it->second;
      lru_.remove(key);
    } else {
      e = std::make_shared<Entry>();
      cache_[key] = e;
      if (static_cast<int>(cache_.size()) > kMaxCachedFiles) {
        cache_.erase(lru_.back());
        lru_.pop_back();
      }
    }
    lru_.push_front(key);
  }
  absl::MutexLock l(&e->mu);
  Downsampled out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) {
      out.missing = true;
      return out;
    }
    return PosixError("open", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = PosixError("stat", path);
    ::close(fd);
    return s;
  }
  if (st.st_ino != e->inode || st.st_size < e->offset) {  // replaced or truncated: start over
    e->inode = st.st_ino;
    e->offset = 0;
    e->partial.clear();
    e->ds.assign(NumMetrics(), Downsampler(kCapacity));
    e->lines.assign(NumMetrics(), 0);
  }
  constexpr int64_t kChunk = 4 << 20;
  std::string text;
  MetricsLine ml;
  while (e->offset < st.st_size) {
    const int64_t n = std::min(kChunk, st.st_size - e->offset);
    text = e->partial;
    const size_t base = text.size();
    text.resize(base + n);
    const ssize_t got = ::pread(fd, text.data() + base, n, e->offset);
    if (got <= 0) break;
    text.resize(base + got);
    e->offset += got;
    const size_t rest = ForEachLine(text, 0, [&](absl::string_view line) {
      if (!ParseMetricsLine(line, &ml)) return;
      if (attempt >= 0 && (!ml.has_attempt || ml.attempt != attempt)) return;
      for (int i = 0; i < NumMetrics(); ++i) {
        if (!ml.has[i]) continue;
        e->ds[i].Add(ml.step, ml.value[i]);
        ++e->lines[i];
      }
    });
    e->partial = text.substr(rest);
  }
  ::close(fd);
  out.buckets = e->ds[m].Buckets(std::min(max_points, kCapacity));
  out.lines = e->lines[m];
  return out;
}

}  // namespace ember::daemon
