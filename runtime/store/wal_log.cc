// The store's write-ahead log: recovery, group commit, compaction (see wal_log.h, docs/store.md).
#include "runtime/store/wal_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/wal.h"
#include "spdlog/spdlog.h"

namespace ember::store {
namespace {

constexpr char kWalName[] = "wal.log";
constexpr char kSnapshotName[] = "snapshot";
constexpr mode_t kDirMode = 0700;   // see PrepareDataDir
constexpr mode_t kFileMode = 0600;  // wal.log, snapshot

// The data directory holds every key and value (job specs, uploads): owner-only by default, or
// owner + group where the operator made it group-accessible; never world-readable.
absl::Status PrepareDataDir(const std::string& dir) {
  if (mkdir(dir.c_str(), kDirMode) != 0 && errno != EEXIST) {
    return base::ErrnoToStatus(errno, absl::StrCat("create --data-dir ", dir));
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return base::ErrnoToStatus(errno, absl::StrCat("stat ", dir));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data-dir ", dir, " exists and is not a directory"));
  }
  mode_t want = st.st_mode & 07750 & ~S_IWGRP;  // drop every "other" bit and group write
  if ((st.st_mode & 07777) != want) {
    spdlog::warn("store: tightening --data-dir {} from {:o} to {:o} (it holds every value)", dir,
                 st.st_mode & 07777, want);
    if (chmod(dir.c_str(), want) != 0) {
      return base::ErrnoToStatus(errno, absl::StrCat("chmod ", dir));
    }
  }
  std::string snap = absl::StrCat(dir, "/", kSnapshotName);
  if (chmod(snap.c_str(), kFileMode) != 0 && errno != ENOENT) {
    return base::ErrnoToStatus(errno, absl::StrCat("chmod ", snap));
  }
  return absl::OkStatus();
}

// Applies one logged record to the state (no observer: nothing listens during recovery).
void Replay(const wal::WalRecord& rec, base::Clock* clock, StoreState* s) {
  switch (rec.op_case()) {
    case wal::WalRecord::kPut:
      if (rec.put().lease_id() != 0 && !s->leases.contains(rec.put().lease_id())) break;
      PutKey(*s, rec.put().key(), rec.put().value(), rec.put().lease_id(), nullptr);
      break;
    case wal::WalRecord::kDel:
      EraseKey(*s, rec.del().key(), nullptr);
      break;
    case wal::WalRecord::kLeaseGrant: {
      const int64_t id = rec.lease_grant().lease_id();
      const int64_t ttl = rec.lease_grant().ttl_ms();
      s->leases[id] = Lease{ttl, clock->Now() + absl::Milliseconds(ttl), {}};
      s->next_lease = std::max(s->next_lease, id + 1);
      break;
    }
    case wal::WalRecord::kLeaseRevoke:
      RevokeLeaseAndKeys(*s, rec.lease_revoke().lease_id(), nullptr);
      break;
    case wal::WalRecord::OP_NOT_SET:
      break;
  }
  s->revision = std::max(s->revision, rec.revision());
}

}  // namespace

wal::Snapshot SnapshotOf(const StoreState& state) {
  wal::Snapshot snap;
  snap.set_revision(state.revision);
  snap.set_next_lease_id(state.next_lease);
  for (const auto& [k, e] : state.kv) {
    auto* en = snap.add_entries();
    en->set_key(k);
    en->set_value(e.value);
    en->set_revision(e.revision);
    en->set_lease_id(e.lease);
  }
  for (const auto& [id, lease] : state.leases) {
    auto* le = snap.add_leases();
    le->set_lease_id(id);
    le->set_ttl_ms(lease.ttl_ms);
  }
  return snap;
}

absl::StatusOr<std::unique_ptr<WalLog>> WalLog::Open(const BackendOptions& options,
                                                     base::Clock* clock, StoreState* state) {
  std::unique_ptr<WalLog> log(new WalLog(options, options.data_dir + "/" + kWalName));
  RETURN_IF_ERROR(log->Recover(clock, state));
  return log;
}

WalLog::~WalLog() {
  if (fd_ >= 0) close(fd_);
}

int64_t WalLog::Append(const wal::WalRecord& rec) {
  std::string payload = rec.SerializeAsString();
  absl::MutexLock l(&buf_mu_);
  AppendFramed(payload, &buf_);
  return ++seq_;
}

int64_t WalLog::last_seq() const {
  absl::MutexLock l(&buf_mu_);
  return seq_;
}

absl::Status WalLog::Commit(int64_t seq, const std::function<wal::Snapshot()>& snapshot) {
  absl::MutexLock wl(&write_mu_);
  if (written_seq_ >= seq) return absl::OkStatus();
  std::string buf;
  int64_t upto;
  {
    absl::MutexLock l(&buf_mu_);
    buf.swap(buf_);
    upto = seq_;
  }
  absl::Status s = base::WriteAll(fd_, buf, path_);
  if (s.ok() && options_.fsync == FsyncPolicy::kAlways && fdatasync(fd_) != 0) {
    s = base::ErrnoToStatus(errno, absl::StrCat("fdatasync ", path_));
  }
  if (!s.ok()) {
    spdlog::critical("store: {}", s.ToString());
    return s;
  }
  written_seq_ = upto;
  bytes_ += static_cast<int64_t>(buf.size());
  if (bytes_ > options_.compact_after_bytes) {
    absl::Status c = Compact(snapshot());
    if (!c.ok()) spdlog::error("store: compaction failed (log keeps growing): {}", c.ToString());
  }
  return absl::OkStatus();
}

// Writes the snapshot, then truncates the log. Records buffered since `snap` was taken are covered
// by it and skipped on replay (revision <= snapshot revision).
absl::Status WalLog::Compact(const wal::Snapshot& snap) {
  std::string framed;
  AppendFramed(snap.SerializeAsString(), &framed);
  RETURN_IF_ERROR(base::WriteFileAtomic(absl::StrCat(options_.data_dir, "/", kSnapshotName),
                                        framed, kFileMode));
  if (ftruncate(fd_, 0) != 0) return base::ErrnoToStatus(errno, "truncate " + path_);
  spdlog::info("store: compacted {} bytes of log into a snapshot of {} keys at revision {}",
               bytes_, snap.entries_size(), snap.revision());
  bytes_ = 0;
  return absl::OkStatus();
}

// Damage found while recovering: without BackendOptions::repair_wal, refuses to start and keeps
// the file as it is; with it, saves a copy of the log and lets recovery truncate at the damage.
absl::Status WalLog::RefuseOrRepair(const std::string& what) {
  if (!options_.repair_wal) {
    return absl::DataLossError(absl::StrCat(
        what, ". The store refuses to start rather than drop acknowledged writes; the file is "
        "left untouched. Restore the data directory from a backup, or restart with --repair to "
        "keep what precedes the damage and discard the rest (a copy of the log is kept)"));
  }
  std::string copy = absl::StrCat(path_, ".damaged-", absl::ToUnixSeconds(absl::Now()));
  RETURN_IF_ERROR(base::CopyFile(path_, copy, kFileMode));
  spdlog::error("store: --repair: {}; truncating the log there (the original log is kept as {})",
                what, copy);
  return absl::OkStatus();
}

absl::Status WalLog::Recover(base::Clock* clock, StoreState* state) {
  RETURN_IF_ERROR(PrepareDataDir(options_.data_dir));
  int64_t snap_rev = 0;
  auto snap_file = ReadFramedFile(options_.data_dir + "/" + kSnapshotName);
  if (snap_file.ok()) {
    wal::Snapshot snap;
    if (snap_file->records.size() != 1 || !snap.ParseFromString(snap_file->records[0])) {
      return absl::DataLossError(absl::StrCat(
          "snapshot ", options_.data_dir, "/", kSnapshotName,
          " is corrupt; restore it from a backup or move it away to start from the log only"));
    }
    absl::Time now = clock->Now();
    for (const auto& le : snap.leases()) {
      state->leases[le.lease_id()] =
          Lease{le.ttl_ms(), now + absl::Milliseconds(le.ttl_ms()), {}};
    }
    for (const auto& en : snap.entries()) {
      state->kv[en.key()] = Entry{en.value(), en.revision(), en.lease_id()};
      if (en.lease_id() != 0) state->leases[en.lease_id()].keys.insert(en.key());
    }
    state->revision = snap_rev = snap.revision();
    state->next_lease = std::max<int64_t>(state->next_lease, snap.next_lease_id());
  } else if (!absl::IsNotFound(snap_file.status())) {
    return snap_file.status();
  }
  auto log = ReadFramedFile(path_);
  if (!log.ok() && !absl::IsNotFound(log.status())) return log.status();
  // Where the log stops being trustworthy: the first bad record, or the end of the valid ones.
  int64_t keep_bytes = log.ok() ? log->valid_bytes : 0;
  if (log.ok() && log->corrupt) {
    std::string after = log->next_valid_offset >= 0
                            ? absl::StrCat("a valid record follows at offset ",
                                           log->next_valid_offset)
                            : "it is not the final record";
    RETURN_IF_ERROR(RefuseOrRepair(absl::StrCat(
        "record at offset ", log->valid_bytes, " of ", path_, " (", log->file_bytes,
        " bytes) fails its checksum and ", after, ": the log is damaged, not torn by a crash")));
  }
  int64_t replayed = 0;
  if (log.ok()) {
    for (size_t i = 0; i < log->records.size(); ++i) {
      wal::WalRecord rec;
      if (!rec.ParseFromString(log->records[i])) {
        keep_bytes = log->offsets[i];
        RETURN_IF_ERROR(RefuseOrRepair(absl::StrCat(
            "record at offset ", keep_bytes, " of ", path_,
            " has a valid checksum but does not parse as a WalRecord")));
        break;
      }
      if (rec.revision() <= snap_rev) continue;
      Replay(rec, clock, state);
      ++replayed;
    }
  }
  fd_ = open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, kFileMode);
  if (fd_ < 0) return base::ErrnoToStatus(errno, absl::StrCat("open ", path_));
  if (fchmod(fd_, kFileMode) != 0) {  // a log written by an older version was 0644
    return base::ErrnoToStatus(errno, absl::StrCat("chmod ", path_));
  }
  absl::MutexLock wl(&write_mu_);
  if (log.ok()) {
    if (keep_bytes < log->file_bytes) {
      if (log->torn_tail && keep_bytes == log->valid_bytes) {
        spdlog::warn("store: discarding a torn record at the end of {} (offset {}, {} bytes): a "
                     "crash interrupted an unacknowledged write",
                     path_, keep_bytes, log->file_bytes - keep_bytes);
      }
      if (ftruncate(fd_, keep_bytes) != 0) {
        return base::ErrnoToStatus(errno, absl::StrCat("truncate ", path_));
      }
    }
    bytes_ = keep_bytes;
  }
  spdlog::info("store: recovered {} keys at revision {} from {} ({} log records replayed)",
               state->kv.size(), state->revision, options_.data_dir, replayed);
  return absl::OkStatus();
}

}  // namespace ember::store
