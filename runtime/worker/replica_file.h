// A replica file: one rank's training state kept in host memory (a file under /dev/shm, mmap'd),
// double-buffered, each buffer ("slot") with a commit record (step + checksum) that is written only
// after the slot's bytes are complete. It outlives the process that wrote it, so a rank killed with
// -9 (and every other rank, which the daemon restarts with it) finds its state there in the next
// attempt (fault_tolerance.replicas: memory; replicas.h, docs/operations.md).
//
// Layout (little-endian, native): a 4096-byte header {magic "EMBREPL1", version, slots (0 meaning
// 2), payload_bytes, fingerprint, a commit record {committed, step, checksum} per slot}, then the
// slots (2, or 3 for an own file across hosts), each payload_bytes rounded up to 4096. The file's
// size is exact; anything else is not a replica file.
//
// Writing a step: BeginWrite picks a slot without a commit, else the one holding the oldest, and clears its
// record (so a crash mid-copy leaves that slot uncommitted and the other one intact), the caller
// fills it, and Commit writes the record with a release store of `committed` last. A reader takes a
// slot only when its record is committed and the checksum of its bytes matches.
//
// Security: the directory comes from OpenReplicaDir (every component checked: no symlinks, owned by
// this user or root, not writable by group or others unless sticky like /dev/shm or /tmp; the last
// one owned by this user, mode 0700); files are opened with O_NOFOLLOW, must be regular files of this
// user, are created 0600 and must have exactly the expected size (else they are re-created empty).
// Names are built from integers only (ReplicaFileName).
//
// Thread safety: a ReplicaFile is used by one thread at a time (the owner serialises the training
// thread's BeginWrite/copy and the transfer thread's Commit). Different processes must not write
// the same file at once (one writer per rank and attempt; ranks of older attempts are killed first).
#ifndef EMBER_RUNTIME_WORKER_REPLICA_FILE_H_
#define EMBER_RUNTIME_WORKER_REPLICA_FILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ember::worker {

// 64-bit checksum of `n` bytes (word-wise multiply-rotate; not cryptographic: it detects a torn or
// partial copy, not an attacker, who cannot write this user's 0600 files anyway).
uint64_t ReplicaChecksum(const void* data, size_t n);

// Opens (creating missing components, 0700) the directory `path` (absolute) after checking every
// component as described above. Returns an O_DIRECTORY descriptor the caller closes.
// FAILED_PRECONDITION naming the component and what is wrong with it (a symlink, another owner,
// writable by others).
absl::StatusOr<int> OpenReplicaDir(const std::string& path);

// "rank-<r>.own" (`holder` < 0) or "rank-<r>.buddy-<holder>": the file of rank r's state, its own
// snapshot or the copy held for it by rank `holder`.
std::string ReplicaFileName(int rank, int holder);

class ReplicaFile {
 public:
  struct Slot {
    int index = 0;
    int64_t step = 0;
    uint64_t checksum = 0;
  };

  // Opens or creates `name` in directory `dirfd` for a payload of `payload_bytes` with
  // `fingerprint` (what the payload's layout is: ranks, shards). An existing file of another size,
  // magic or fingerprint is re-created empty (no committed slot); *reset (if given) says so.
  // `slots`: 2 (double-buffered) or 3 (an own file whose buddy copy may lag two steps behind it:
  // cross-host replicas, replicas.h); a file with another count is re-created too.
  static constexpr int kMaxSlots = 3;
  static absl::StatusOr<std::unique_ptr<ReplicaFile>> Open(int dirfd, const std::string& name,
                                                           int64_t payload_bytes, uint64_t fingerprint,
                                                           bool* reset = nullptr, int slots = 2);
  // Opens an existing file read-only for recovery; NOT_FOUND when absent, FAILED_PRECONDITION when
  // it is not a replica file of this size and fingerprint.
  static absl::StatusOr<std::unique_ptr<ReplicaFile>> OpenExisting(int dirfd, const std::string& name,
                                                                   int64_t payload_bytes, uint64_t fingerprint);
  ~ReplicaFile();
  ReplicaFile(const ReplicaFile&) = delete;
  ReplicaFile& operator=(const ReplicaFile&) = delete;

  // Opens an existing replica file read-write, whatever its payload size and fingerprint (taken
  // from its header): a holder reopening the copies it holds for other ranks after a restart.
  // NOT_FOUND when absent, FAILED_PRECONDITION when it is not a replica file (header, size).
  static absl::StatusOr<std::unique_ptr<ReplicaFile>> OpenHeld(int dirfd, const std::string& name);

  // Where a peer finds the parts of a file of `payload_bytes` (the same layout on every host): the
  // byte offset of slot `index`'s commit record (kRecordBytes: {committed, step, checksum, pad},
  // 8 bytes each) and of its payload, from the start of the file.
  static constexpr int64_t kRecordBytes = 32;
  static int64_t RecordOffset(int index);
  static int64_t SlotOffset(int64_t payload_bytes, int index);
  // The slot a record's bytes (kRecordBytes, as at RecordOffset) describe, when committed.
  static std::optional<Slot> ParseRecord(const uint8_t* record, int index);
  // Fills kRecordBytes at `out`: committed (0 or 1), step, checksum.
  static void PackRecord(uint8_t* out, bool committed, int64_t step, uint64_t checksum);

  // Committed slots, newest step first, whose bytes match their checksum (verified on each call).
  std::vector<Slot> Committed() const;
  // The committed slot of `step` (checksum verified), or nullopt.
  std::optional<Slot> Find(int64_t step) const;
  // The commit records as written, without verifying the bytes (tests: what a reader would trust).
  std::vector<Slot> RawCommitted() const;

  // The slot to write next (one without a commit, else the one holding the oldest), its record cleared.
  int BeginWrite();
  // Writes slot `index`'s commit record: step and checksum, then `committed` (release).
  void Commit(int index, int64_t step, uint64_t checksum);

  uint8_t* slot(int index) const;
  const uint8_t* data(int index) const { return slot(index); }
  uint8_t* base() const { return base_; }  // the whole mapping, file_bytes() long
  int64_t payload_bytes() const { return payload_bytes_; }
  int slots() const { return slots_; }
  uint64_t fingerprint() const;
  int64_t file_bytes() const { return file_bytes_; }
  const std::string& name() const { return name_; }

 private:
  ReplicaFile(std::string name, uint8_t* base, int64_t file_bytes, int64_t payload_bytes, int slots);
  struct Record;
  Record* record(int index) const;

  const std::string name_;
  uint8_t* const base_;
  const int64_t file_bytes_, payload_bytes_;
  const int slots_;
};

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_REPLICA_FILE_H_
