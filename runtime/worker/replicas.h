// In-memory replicas (issue 35, items 1-2; fault_tolerance: {replicas: memory, every_steps: K}):
// every K-th step each rank copies its state (every parameter shard with its AdamW state, the
// optimizer step, the data loader's position; the data order's only randomness is (seed, position),
// which the spec and the position fix) into two replica files (replica_file.h) in the job's replica
// directory (EMBER_REPLICA_DIR, under /dev/shm): its own snapshot and the copy held for it by its
// buddy rank. A restarted attempt (a lost rank restarts every rank) resumes from the newest step for
// which every rank has a committed copy, own or buddy's, agreed through the store, before looking
// at disk checkpoints: with K = 1 no step is lost and no checkpoint is read.
//
// Buddies: rank r's buddy is r + local_world_size (mod world) when the job spans several hosts,
// else r + 1 (mod world). This build keeps every replica file in the writing host's /dev/shm (no
// one-sided transfer to the buddy's host yet), so a buddy copy covers a lost process, not a lost
// host; the log says so at start.
//
// Timing: Save copies the state into the own file's free slot on the training thread (a memcpy),
// checksums and commits it there (so once Save returns, the step's own copy is committed); then a
// transfer thread copies it into the buddy file's free slot and commits that, overlapped with the
// next step. The next Save first waits for that transfer, so at
// most one is in flight and each file always holds one complete committed step besides the one
// being written (double buffering).
//
// Thread safety: every method from the training thread; the transfer thread is internal.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Replicas> r, Replicas::Open(plan, state));  // nullptr: off
//   ASSIGN_OR_RETURN(std::optional<int64_t> at, ResumeFromReplicas(plan, attempt, *r, state, loader));
//   if (r->Due(step)) RETURN_IF_ERROR(r->Save(step, state, loader));
#ifndef EMBER_RUNTIME_WORKER_REPLICAS_H_
#define EMBER_RUNTIME_WORKER_REPLICAS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/data/token_file.h"
#include "runtime/store/client.h"
#include "runtime/worker/replica_file.h"
#include "runtime/worker/train_state.h"
#include "runtime/worker/trainer.h"

namespace ember::worker {

class Replicas {
 public:
  struct Options {
    std::string dir;  // the job's replica directory (OpenReplicaDir checks it)
    int rank = 0, world = 1, local_world = 1;
    int64_t every_steps = 1;
    // Tests: called halfway through each copy with "own" or "buddy" (e.g. to kill the process
    // mid-transfer). Runs on the thread doing the copy.
    std::function<void(const std::string& stage)> test_hook;
  };

  // The job's replicas for this rank (files created or reopened; what they already hold is kept
  // for ResumeFromReplicas). nullptr when fault_tolerance.replicas is not memory.
  static absl::StatusOr<std::unique_ptr<Replicas>> Open(const Plan& plan, TrainState& state);
  static absl::StatusOr<std::unique_ptr<Replicas>> Open(const Options& o, TrainState& state);
  ~Replicas();  // waits for a transfer in flight

  // The buddy of `rank` (see above).
  static int BuddyOf(int rank, int world, int local_world);

  bool Due(int64_t step) const { return step % every_steps_ == 0; }
  // Copies the state after optimizer step `step` (host memory: SyncHost first) into the own file,
  // commits it, and starts the buddy copy. Returns the previous transfer's error, if any.
  absl::Status Save(int64_t step, TrainState& state, const data::TokenLoader& loader);
  // Waits for the transfer in flight (the job's end; tests). The transfer itself cannot fail (memory
  // copies into mapped files); the Status is for a future cross-host transfer.
  absl::Status Wait();

  // Steps whose state this rank can restore: committed and checksum-verified in its own file or
  // in its buddy copy; newest first.
  std::vector<int64_t> Available() const;
  // Restores the state of `step` (own copy, else the buddy's): shards, AdamW state, optimizer step,
  // loader position. Returns "own" or "buddy"; NOT_FOUND when neither holds it.
  absl::StatusOr<std::string> Restore(int64_t step, TrainState& state, data::TokenLoader& loader);

  ReplicaCounts& counts() { return counts_; }
  int buddy() const { return buddy_; }

 private:
  Replicas(const Options& o, int dirfd, int64_t payload, uint64_t fingerprint,
           std::unique_ptr<ReplicaFile> own, std::unique_ptr<ReplicaFile> copy);
  void Transfer(int own_slot, int64_t step, uint64_t checksum);

  const Options opts_;
  const int dirfd_;
  const int64_t payload_;
  const uint64_t fingerprint_;
  const int buddy_;
  int64_t every_steps_;
  std::unique_ptr<ReplicaFile> own_, copy_;  // copy_: held for this rank by its buddy
  std::thread transfer_;
  int64_t in_flight_ = -1;  // the step the transfer thread is committing
  ReplicaCounts counts_;
};

// SyncHost, then Save (the training loop's hook).
inline absl::Status SyncAndSave(Replicas& r, int64_t step, TrainState& state, const data::TokenLoader& loader) {
  absl::Status st = state.SyncHost();
  return st.ok() ? r.Save(step, state, loader) : st;
}

// The newest step every rank of the attempt can restore from memory (-1: none), and the newest
// disk checkpoint step any rank sees (0: none): each rank publishes "disk=<its disk step>;<its
// Available() steps>" under job::keys::ReplicasOf(rank) and reads every other rank's (waiting up
// to `timeout`). Every rank computes the same answer from the same keys.
struct ReplicaAgreement {
  int64_t step = -1;
  int64_t disk_step = 0;
};
absl::StatusOr<ReplicaAgreement> AgreeReplicaStep(store::Client& attempt, int rank, int world,
                                                  const std::vector<int64_t>& mine, int64_t disk_step,
                                                  absl::Duration timeout);

// The resume hook of the training loop: agree on a step, and restore it unless a disk checkpoint
// is newer (by its directory name; nothing on disk is read). Returns the step resumed after, or
// nullopt to fall back to disk checkpoints; logs the path taken and fills counts().
absl::StatusOr<std::optional<int64_t>> ResumeFromReplicas(const Plan& plan, store::Client& attempt,
                                                          Replicas& replicas, TrainState& state,
                                                          data::TokenLoader& loader);

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_REPLICAS_H_
