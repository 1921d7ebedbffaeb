// FlightRecorder: a fixed-size ring of the last N communication ops of one process, for post-mortem
// debugging of hangs (which rank never joined, where ranks disagree). Dumped as versioned JSON
// (schema in docs/flight-recorder.md) on timeout, on a store dump request, on SIGUSR1 or by API.
//
// Not a singleton: the owner creates one per process (or per test) and passes a pointer to every
// process group; it must outlive them. Thread-safe: Record/Start/Complete/Fail may be called from
// any thread. The hot path (Record + Start + Complete) allocates nothing: entries are fixed-size
// records in a preallocated ring; strings are truncated copies into fixed arrays.
//
//   flight::FlightRecorder fr({.capacity = 2000});
//   int gid = fr.RegisterGroup({.name = "world", .rank = 0, .size = 4});
//   uint64_t id = fr.Record({.group_id = gid, .collective_seq = 7, .op = "all_reduce", ...});
//   fr.Start(id); ...; fr.Complete(id);
//   RETURN_IF_ERROR(fr.DumpToFile("/tmp/fr/rank-0.json", "api"));
#ifndef EMBER_RUNTIME_FLIGHT_RECORDER_H_
#define EMBER_RUNTIME_FLIGHT_RECORDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace ember::flight {

// Bump the minor version when adding fields, the major when changing existing ones.
inline constexpr char kSchemaName[] = "ember.flight_recorder";
inline constexpr int kSchemaMajor = 1;
inline constexpr int kSchemaMinor = 1;  // 1.1: groups[].memory_bytes

enum class State : uint8_t { kScheduled, kStarted, kCompleted, kFailed };
const char* StateName(State s);

// What the caller knows when it schedules an op. String views must stay valid during Record().
struct OpRecord {
  int group_id = -1;            // from RegisterGroup
  int64_t collective_seq = -1;  // per group, 1-based; -1 for p2p ops
  int64_t p2p_seq = -1;         // per group, 1-based; -1 for collectives
  absl::string_view op;         // "all_reduce", "send", ...
  int64_t in_numel = 0, out_numel = 0;
  const char* in_dtype = "";    // static strings (comm::DTypeName)
  const char* out_dtype = "";
  int peer = -1;                // p2p: the other rank (group rank); broadcast: root
  int64_t timeout_ms = 0;
  absl::string_view tag;        // the caller's tag (free text, e.g. "step 12 grads")
};

struct Entry {
  uint64_t record_id = 0;  // 1-based, process-wide for this recorder
  int group_id = -1;
  char group_name[48] = {};
  int64_t collective_seq = -1, p2p_seq = -1;
  char op[32] = {};
  int64_t in_numel = 0, out_numel = 0;
  const char* in_dtype = "";
  const char* out_dtype = "";
  int peer = -1;
  State state = State::kScheduled;
  int64_t time_created_ns = 0, time_started_ns = 0, time_completed_ns = 0;  // CLOCK_REALTIME
  // Device ops: when the op ran on the device (from its CUDA events; 0 = unknown). For them
  // time_completed_ns is when the op was enqueued.
  int64_t device_start_ns = 0, device_end_ns = 0;
  int64_t timeout_ms = 0;
  char tag[64] = {};
  char error[160] = {};
};

struct GroupInfo {
  std::string name;
  int rank = 0;              // rank in the group
  int size = 1;
  int global_rank = -1;      // rank in the world group, if known
  std::vector<int> global_ranks;  // members' world ranks, if known
  std::string backend = "cpu";
  // Maintained by the recorder from the group's collective records.
  int64_t last_enqueued_seq = 0, last_started_seq = 0, last_completed_seq = 0;
  int64_t last_p2p_seq = 0;
  // Memory the group's communicators hold outside any allocator (shm segments, NCCL buffers), as
  // its backend last reported it (SetGroupMemory); 0 = none or unknown.
  int64_t memory_bytes = 0;
};

struct RecorderOptions {
  size_t capacity = 2000;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(RecorderOptions options = {});
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Registers a group; returns its id (small, dense). Allocates (not on the hot path).
  int RegisterGroup(GroupInfo info);

  // Records a scheduled op; returns its record id. Overwrites the oldest entry when full.
  uint64_t Record(const OpRecord& r);
  // The group's communicator memory (GroupInfo::memory_bytes), reported by its owner.
  void SetGroupMemory(int group_id, int64_t bytes);
  // State transitions. Ignored when the entry has already been overwritten.
  void Start(uint64_t record_id);
  void Complete(uint64_t record_id);
  void Fail(uint64_t record_id, absl::string_view error);
  // Device ops: the op's device start/end times (CLOCK_REALTIME ns), once its events completed.
  void SetDeviceTimes(uint64_t record_id, int64_t start_ns, int64_t end_ns);

  size_t capacity() const { return capacity_; }
  // Entries held now (at most capacity()).
  size_t size() const;
  // Entries oldest first (a copy) and the groups.
  std::vector<Entry> Entries() const;
  std::vector<GroupInfo> Groups() const;

  // The versioned JSON document. `rank` is this process's world rank (-1 if unknown).
  std::string DumpJson(absl::string_view reason, int rank) const;
  // Writes DumpJson to `path` atomically and durably (base::WriteFileAtomic), creating the
  // directory (base::MakeDirs).
  absl::Status DumpToFile(const std::string& path, absl::string_view reason, int rank) const;

  // Dedupes dumps when several groups (sharing this recorder) see the same request: returns true
  // the first time it is called with a given key.
  bool ClaimDump(absl::string_view request_key);

  static int64_t NowNanos();

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::vector<Entry> ring_ ABSL_GUARDED_BY(mu_);  // sized once
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<GroupInfo> groups_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> claimed_ ABSL_GUARDED_BY(mu_);
};

// SIGUSR1 support: the handler only bumps a counter (async-signal-safe); watchdogs poll
// DumpSignalCount() and dump when it changes. Idempotent; chains no previous handler.
void InstallDumpSignalHandler(int signo);
uint64_t DumpSignalCount();

}  // namespace ember::flight

#endif  // EMBER_RUNTIME_FLIGHT_RECORDER_H_
