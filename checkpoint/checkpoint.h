// Saving and loading Ember checkpoints (format: format.h, docs/checkpoint-format.md).
//
// Save (every rank, in parallel; the commit protocol is commit.h):
//   RankState st{.step = 100};
//   st.tensors.push_back({"layer0.w", DType::kF32, {1024, 512}, /*row_begin=*/r0, bytes});
//   st.rng_state = ...; st.data_loader_state = ...;
//   RETURN_IF_ERROR(SaveCheckpoint({.root = dir, .rank = r, .world_size = n}, st, &protocol));
// SaveCheckpoint returns OK on a rank only once rank 0 has committed the step (renamed it into
// place and moved `latest`); any failure on any rank makes it fail everywhere.
//
// Load (any world size, any rank; resharding is just asking for another row range):
//   ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir));   // dir = root (follows latest) or step dir
//   ASSIGN_OR_RETURN(std::string rows, reader->ReadShard("layer0.w", rank, world, DType::kBF16));
//
// Thread-safety: SaveCheckpoint is reentrant (one call per rank); AsyncSaver and CheckpointReader
// are thread-safe.
#ifndef EMBER_CHECKPOINT_CHECKPOINT_H_
#define EMBER_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpoint/commit.h"
#include "checkpoint/file_util.h"
#include "checkpoint/format.h"

namespace ember::ckpt {

// One local shard of a dim-0 sharded tensor: global rows [row_begin, row_begin + rows), where
// rows = data.size() / row bytes. Zero rows is fine (a rank past the end under torch.chunk). A
// tensor nobody shards is saved by one rank with row_begin 0 and all rows. Optimizer state is just
// more tensors, named "optim.<param>.exp_avg" and so on.
struct ShardSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> global_shape;
  int64_t row_begin = 0;
  absl::string_view data;  // borrowed; must stay valid for the call (AsyncSaver copies it)
};

struct RankState {
  int64_t step = 0;
  std::vector<ShardSpec> tensors;
  std::string rng_state;          // opaque bytes, kept per saving rank
  std::string data_loader_state;  // opaque bytes, kept per saving rank
  std::map<std::string, std::string> extra;        // rank 0's is kept
  std::map<std::string, std::string> parallelism;  // rank 0's is kept
};

struct SaveOptions {
  std::string root;            // holds step-<N>/, .tmp-step-<N>/, latest
  int rank = 0;
  int world_size = 1;
  // Committed checkpoints kept: rank 0 deletes steps older than the newest keep_last at or below
  // the step it commits (>= 1). A step newer than the one committed (left by an earlier run that
  // got further) is never deleted, and a step directory that already exists is moved aside to
  // .superseded-step-<N>-<unix ms>/ (logged), never deleted.
  int keep_last = 3;
  absl::Duration commit_timeout = absl::Minutes(10);  // waiting for other ranks / the outcome
  absl::Duration TEST_delay_per_tensor = absl::ZeroDuration();  // slows writes (kill tests)
};

absl::Status SaveCheckpoint(const SaveOptions& opts, const RankState& state, CommitProtocol* protocol);

// Background saves: Start copies the state into host memory and returns; the write and commit run
// on a background thread. At most one save is in flight: Start first waits for the previous one.
// A failed save is never lost: if the previous save failed and nobody collected its error with
// Wait(), Start returns that error and does not start the new save.
class AsyncSaver {
 public:
  AsyncSaver(SaveOptions opts, std::shared_ptr<CommitProtocol> protocol);
  ~AsyncSaver();  // waits for the save in flight
  absl::Status Start(const RankState& state);
  // Blocks until no save is in flight; returns the last save's result (OK only if committed) and
  // marks it collected.
  absl::Status Wait();
  // Time the last Start() blocked the caller (waiting for the previous save plus the host copy).
  absl::Duration last_blocked() const;
  std::optional<int64_t> last_committed_step() const;

 private:
  const SaveOptions opts_;
  const std::shared_ptr<CommitProtocol> protocol_;
  mutable absl::Mutex mu_;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_ ABSL_GUARDED_BY(mu_);
  bool collected_ ABSL_GUARDED_BY(mu_) = true;
  absl::Duration last_blocked_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> committed_ ABSL_GUARDED_BY(mu_);
};

// `root/latest` names the newest committed step directory; NOT_FOUND when there is none.
absl::StatusOr<std::string> ResolveLatest(const std::string& root);
// The step directory a (re)starting run resumes from. `latest` wins when it names a step
// directory holding metadata.json. Otherwise (latest missing, empty, garbage, or naming a missing
// or incomplete directory) the committed step directories are tried newest first and the first
// that opens and passes VerifyAll is returned; a warning is logged naming the one chosen and
// every one skipped, with why. NOT_FOUND when root holds no committed step at all (a fresh
// start); DATA_LOSS listing each failure when steps exist but none verifies (nothing is deleted:
// repair `latest` or move the directories away to start fresh).
absl::StatusOr<std::string> FindResumeCheckpoint(const std::string& root);
// Committed steps under root, ascending.
std::vector<int64_t> ListSteps(const std::string& root);
std::string StepDirName(int64_t step);  // "step-<N>"

class CheckpointReader {
 public:
  // `path` is a step directory (has metadata.json) or a root (follows `latest`).
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& path);

  const Metadata& metadata() const { return meta_; }
  const std::string& dir() const { return dir_; }
  // Global rows [row_begin, row_end) of `name` as packed bytes, converted to `as` when given.
  // Every chunk touched is checksummed (once per reader); errors name tensor, chunk and file.
  absl::StatusOr<std::string> ReadRows(absl::string_view name, int64_t row_begin, int64_t row_end,
                                       std::optional<DType> as = std::nullopt) const;
  // This rank's torch.chunk row range of `name` at world size `world`.
  absl::StatusOr<std::string> ReadShard(absl::string_view name, int rank, int world,
                                        std::optional<DType> as = std::nullopt) const;
  absl::StatusOr<std::string> ReadFull(absl::string_view name,
                                       std::optional<DType> as = std::nullopt) const;
  // A saving rank's blob ("rng", "data_loader"); NOT_FOUND if that rank saved none.
  absl::StatusOr<std::string> ReadBlob(int saved_rank, absl::string_view blob) const;
  // Checks every chunk and blob, reading each in bounded pieces (memory stays at a few MiB
  // whatever the sizes); the error lists each missing or corrupt one.
  absl::Status VerifyAll() const;
  // Streams chunk `c`'s bytes to `fn` in pieces of at most 4 MiB, then checks its checksum:
  // DATA_LOSS (naming `what`, file and offset) when it does not match, after `fn` has seen the
  // bytes, so a consumer must discard its output on error. Memory stays bounded.
  absl::Status StreamChunk(const ChunkRef& c, const std::string& what,
                           const std::function<absl::Status(absl::string_view)>& fn) const;

 private:
  CheckpointReader() = default;
  absl::StatusOr<absl::string_view> ChunkBytes(const ChunkRef& c, const std::string& what) const;
  // Opens (once) the chunk's file and checks the chunk lies inside its size on disk, before any
  // byte is read or buffer allocated.
  absl::StatusOr<const RegularFile*> CheckOnDisk(const ChunkRef& c, const std::string& what) const;

  std::string dir_;
  Metadata meta_;
  mutable absl::Mutex mu_;
  mutable std::map<std::string, std::unique_ptr<MappedFile>> files_ ABSL_GUARDED_BY(mu_);
  mutable std::map<std::pair<std::string, uint64_t>, bool> verified_ ABSL_GUARDED_BY(mu_);
  mutable std::map<std::string, std::unique_ptr<RegularFile>> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_CHECKPOINT_H_
