// WalLog: the durable half of the memory backend (BackendOptions::data_dir): recovery from the
// snapshot and the write-ahead log, group-committed appends, and compaction into a new snapshot.
//
// Files (framed records, wal.h; docs/store.md): data_dir/snapshot holds one wal::Snapshot,
// data_dir/wal.log the wal::WalRecords written since. Recovery loads the snapshot, replays the
// records with a higher revision, and decides what the log's tail is: a torn final record (a crash
// mid-append; nothing in it was acknowledged) is dropped; damage followed by valid records is
// DATA_LOSS, the file untouched, unless options.repair_wal, which keeps a copy of the log
// (wal.log.damaged-<time>) and truncates at the damage.
//
// Thread-safety: Append and Commit may be called from any thread. Append is called under the
// owner's state lock (so records are buffered in revision order) and takes only a leaf lock.
// Commit must be called WITHOUT the owner's lock: it may call `snapshot`, which takes it.
#ifndef EMBER_RUNTIME_STORE_WAL_LOG_H_
#define EMBER_RUNTIME_STORE_WAL_LOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/store_wal.pb.h"
#include "runtime/base/clock.h"
#include "runtime/store/backend.h"
#include "runtime/store/state.h"

namespace ember::store {

class WalLog {
 public:
  // Prepares options.data_dir (created 0700; group write and every "other" bit dropped), loads
  // the snapshot and replays the log into *state (empty on entry), truncates a torn or repaired
  // tail, and opens the log for appending. Errors name the file and offset. `clock` is borrowed
  // (lease expiry of recovered leases) and `state` only used during the call.
  static absl::StatusOr<std::unique_ptr<WalLog>> Open(const BackendOptions& options,
                                                      base::Clock* clock, StoreState* state);
  ~WalLog();
  WalLog(const WalLog&) = delete;
  WalLog& operator=(const WalLog&) = delete;

  // Buffers `rec` (its revision already set). Returns its sequence number for Commit.
  int64_t Append(const wal::WalRecord& rec) ABSL_LOCKS_EXCLUDED(buf_mu_);
  // The sequence number of the last record buffered.
  int64_t last_seq() const ABSL_LOCKS_EXCLUDED(buf_mu_);

  // Writes every record buffered so far unless a commit already covered `seq` (one caller writes
  // for everyone waiting: group commit); with FsyncPolicy::kAlways also fdatasyncs. Past
  // options.compact_after_bytes, writes `snapshot()` as the new snapshot and truncates the log (a
  // failed compaction is logged; the log keeps growing). Errors name the file.
  absl::Status Commit(int64_t seq, const std::function<wal::Snapshot()>& snapshot)
      ABSL_LOCKS_EXCLUDED(write_mu_, buf_mu_);

 private:
  WalLog(const BackendOptions& options, std::string path) : options_(options), path_(path) {}
  absl::Status Recover(base::Clock* clock, StoreState* state);
  absl::Status RefuseOrRepair(const std::string& what);
  absl::Status Compact(const wal::Snapshot& snap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  const BackendOptions options_;
  const std::string path_;  // data_dir/wal.log

  // Lock order: write_mu_, then the owner's state lock (in `snapshot`), then buf_mu_.
  absl::Mutex write_mu_;
  int fd_ = -1;  // open for appending after Open; written under write_mu_
  int64_t written_seq_ ABSL_GUARDED_BY(write_mu_) = 0;
  int64_t bytes_ ABSL_GUARDED_BY(write_mu_) = 0;  // size of wal.log

  mutable absl::Mutex buf_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  std::string buf_ ABSL_GUARDED_BY(buf_mu_);  // framed records not yet written
  int64_t seq_ ABSL_GUARDED_BY(buf_mu_) = 0;
};

// The whole state as a snapshot record (the owner calls it under its lock).
wal::Snapshot SnapshotOf(const StoreState& state);

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_WAL_LOG_H_
