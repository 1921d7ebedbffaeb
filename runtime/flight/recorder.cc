#include "runtime/flight/recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/files.h"
#include "runtime/base/logging.h"
#include "runtime/base/status_macros.h"

namespace ember::flight {
namespace {

void CopyTrunc(char* dst, size_t cap, absl::string_view s) {
  size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

std::atomic<uint64_t> g_signal_count{0};

void OnDumpSignal(int) { g_signal_count.fetch_add(1, std::memory_order_relaxed); }

std::string Quote(absl::string_view s) { return absl::StrCat("\"", base::JsonEscape(s), "\""); }

}  // namespace

const char* StateName(State s) {
  switch (s) {
    case State::kScheduled: return "scheduled";
    case State::kStarted: return "started";
    case State::kCompleted: return "completed";
    case State::kFailed: return "failed";
  }
  return "?";
}

int64_t FlightRecorder::NowNanos() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

FlightRecorder::FlightRecorder(RecorderOptions options)
    : capacity_(std::max<size_t>(1, options.capacity)) {
  absl::MutexLock l(&mu_);
  ring_.resize(capacity_);
}

int FlightRecorder::RegisterGroup(GroupInfo info) {
  absl::MutexLock l(&mu_);
  groups_.push_back(std::move(info));
  return static_cast<int>(groups_.size()) - 1;
}

void FlightRecorder::SetGroupMemory(int group_id, int64_t bytes) {
  absl::MutexLock l(&mu_);
  if (group_id >= 0 && group_id < static_cast<int>(groups_.size())) {
    groups_[group_id].memory_bytes = bytes;
  }
}

uint64_t FlightRecorder::Record(const OpRecord& r) {
  int64_t now = NowNanos();
  absl::MutexLock l(&mu_);
  uint64_t id = next_id_++;
  Entry& e = ring_[id % capacity_];
  e.record_id = id;
  e.group_id = r.group_id;
  if (r.group_id >= 0 && r.group_id < static_cast<int>(groups_.size())) {
    GroupInfo& g = groups_[r.group_id];
    CopyTrunc(e.group_name, sizeof(e.group_name), g.name);
    if (r.collective_seq > 0) g.last_enqueued_seq = std::max(g.last_enqueued_seq, r.collective_seq);
    if (r.p2p_seq > 0) g.last_p2p_seq = std::max(g.last_p2p_seq, r.p2p_seq);
  } else {
    e.group_name[0] = '\0';
  }
  e.collective_seq = r.collective_seq;
  e.p2p_seq = r.p2p_seq;
  CopyTrunc(e.op, sizeof(e.op), r.op);
  e.in_numel = r.in_numel;
  e.out_numel = r.out_numel;
  e.in_dtype = r.in_dtype;
  e.out_dtype = r.out_dtype;
  e.peer = r.peer;
  e.state = State::kScheduled;
  e.time_created_ns = now;
  e.time_started_ns = 0;
  e.time_completed_ns = 0;
  e.device_start_ns = e.device_end_ns = 0;
  e.timeout_ms = r.timeout_ms;
  CopyTrunc(e.tag, sizeof(e.tag), r.tag);
  e.error[0] = '\0';
  return id;
}

void FlightRecorder::Start(uint64_t id) {
  int64_t now = NowNanos();
  absl::MutexLock l(&mu_);
  Entry& e = ring_[id % capacity_];
  if (e.record_id != id) return;
  e.state = State::kStarted;
  e.time_started_ns = now;
  if (e.collective_seq > 0 && e.group_id >= 0 && e.group_id < static_cast<int>(groups_.size())) {
    auto& g = groups_[e.group_id];
    g.last_started_seq = std::max(g.last_started_seq, e.collective_seq);
  }
}

void FlightRecorder::SetDeviceTimes(uint64_t id, int64_t start_ns, int64_t end_ns) {
  absl::MutexLock l(&mu_);
  Entry& e = ring_[id % capacity_];
  if (e.record_id != id) return;
  e.device_start_ns = start_ns;
  e.device_end_ns = end_ns;
}

void FlightRecorder::Complete(uint64_t id) {
  int64_t now = NowNanos();
  absl::MutexLock l(&mu_);
  Entry& e = ring_[id % capacity_];
  if (e.record_id != id) return;
  e.state = State::kCompleted;
  if (e.time_started_ns == 0) e.time_started_ns = now;
  e.time_completed_ns = now;
  if (e.collective_seq > 0 && e.group_id >= 0 && e.group_id < static_cast<int>(groups_.size())) {
    auto& g = groups_[e.group_id];
    g.last_completed_seq = std::max(g.last_completed_seq, e.collective_seq);
  }
}

void FlightRecorder::Fail(uint64_t id, absl::string_view error) {
  int64_t now = NowNanos();
  absl::MutexLock l(&mu_);
  Entry& e = ring_[id % capacity_];
  if (e.record_id != id) return;
  e.state = State::kFailed;
  e.time_completed_ns = now;
  CopyTrunc(e.error, sizeof(e.error), error);
}

size_t FlightRecorder::size() const {
  absl::MutexLock l(&mu_);
  return static_cast<size_t>(std::min<uint64_t>(next_id_ - 1, capacity_));
}

std::vector<Entry> FlightRecorder::Entries() const {
  absl::MutexLock l(&mu_);
  std::vector<Entry> out;
  out.reserve(capacity_);
  uint64_t first = next_id_ > capacity_ ? next_id_ - capacity_ : 1;
  for (uint64_t id = first; id < next_id_; ++id) out.push_back(ring_[id % capacity_]);
  return out;
}

std::vector<GroupInfo> FlightRecorder::Groups() const {
  absl::MutexLock l(&mu_);
  return groups_;
}

bool FlightRecorder::ClaimDump(absl::string_view key) {
  absl::MutexLock l(&mu_);
  for (const auto& k : claimed_)
    if (k == key) return false;
  claimed_.emplace_back(key);
  return true;
}

std::string FlightRecorder::DumpJson(absl::string_view reason, int rank) const {
  std::vector<Entry> entries = Entries();  // snapshot under the lock, format outside it
  std::vector<GroupInfo> groups = Groups();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string out;
  out.reserve(256 + entries.size() * 420);
  absl::StrAppend(&out, "{\n  \"schema\": \"", kSchemaName, "\",\n  \"version\": \"", kSchemaMajor,
                  ".", kSchemaMinor, "\",\n  \"rank\": ", rank, ",\n  \"pid\": ", getpid(),
                  ",\n  \"host\": ", Quote(host), ",\n  \"reason\": ", Quote(reason),
                  ",\n  \"dump_time_ns\": ", NowNanos(), ",\n  \"capacity\": ", capacity_,
                  ",\n  \"groups\": [");
  for (size_t i = 0; i < groups.size(); ++i) {
    const GroupInfo& g = groups[i];
    absl::StrAppend(&out, i ? "," : "", "\n    {\"id\": ", i, ", \"name\": ", Quote(g.name),
                    ", \"backend\": ", Quote(g.backend), ", \"rank\": ", g.rank,
                    ", \"size\": ", g.size, ", \"global_rank\": ", g.global_rank,
                    ", \"global_ranks\": [");
    for (size_t k = 0; k < g.global_ranks.size(); ++k)
      absl::StrAppend(&out, k ? ", " : "", g.global_ranks[k]);
    absl::StrAppend(&out, "], \"last_enqueued_seq\": ", g.last_enqueued_seq,
                    ", \"last_started_seq\": ", g.last_started_seq,
                    ", \"last_completed_seq\": ", g.last_completed_seq,
                    ", \"last_p2p_seq\": ", g.last_p2p_seq,
                    ", \"memory_bytes\": ", g.memory_bytes, "}");
  }
  absl::StrAppend(&out, "\n  ],\n  \"entries\": [");
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    absl::StrAppend(&out, i ? "," : "", "\n    {\"record_id\": ", e.record_id,
                    ", \"group_id\": ", e.group_id, ", \"group_name\": ", Quote(e.group_name),
                    ", \"collective_seq\": ", e.collective_seq, ", \"p2p_seq\": ", e.p2p_seq,
                    ", \"op\": ", Quote(e.op), ", \"in_numel\": ", e.in_numel,
                    ", \"out_numel\": ", e.out_numel, ", \"in_dtype\": ", Quote(e.in_dtype),
                    ", \"out_dtype\": ", Quote(e.out_dtype), ", \"peer\": ", e.peer,
                    ", \"state\": \"", StateName(e.state), "\"");
    absl::StrAppend(&out, ", \"time_created_ns\": ", e.time_created_ns,
                    ", \"time_started_ns\": ", e.time_started_ns,
                    ", \"time_completed_ns\": ", e.time_completed_ns,
                    ", \"device_start_ns\": ", e.device_start_ns,
                    ", \"device_end_ns\": ", e.device_end_ns,
                    ", \"timeout_ms\": ", e.timeout_ms, ", \"tag\": ", Quote(e.tag),
                    ", \"error\": ", Quote(e.error), "}");
  }
  absl::StrAppend(&out, "\n  ]\n}\n");
  return out;
}

absl::Status FlightRecorder::DumpToFile(const std::string& path, absl::string_view reason,
                                        int rank) const {
  std::string json = DumpJson(reason, rank);
  size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    RETURN_IF_ERROR(base::MakeDirs(path.substr(0, slash)));
  }
  return base::WriteFileAtomic(path, json);
}

void InstallDumpSignalHandler(int signo) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnDumpSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(signo, &sa, nullptr);
}

uint64_t DumpSignalCount() { return g_signal_count.load(std::memory_order_relaxed); }

}  // namespace ember::flight
