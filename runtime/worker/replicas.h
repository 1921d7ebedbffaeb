// In-memory replicas (issue 35, items 1-2; fault_tolerance: {replicas: memory, every_steps: K}):
// every K-th step each rank copies its state (every parameter shard with its AdamW state, the
// optimizer step, the data loader's position; the data order's only randomness is (seed, position),
// which the spec and the position fix) into two replica files (replica_file.h, double-buffered,
// under /dev/shm): its own snapshot in its host's replica directory (EMBER_REPLICA_DIR), and the
// copy held for it by its buddy rank. A restarted attempt (a lost rank restarts every rank) resumes
// from the newest step for which every rank has a committed copy (own, or a buddy's on this host or
// on another), agreed through the store, before looking at disk checkpoints: with K = 1 no step is
// lost and no checkpoint is read.
//
// Buddies: rank r's buddy is r + local_world_size (mod world) when the job spans several hosts
// (so on another host), else r + 1 (mod world).
//   * One host (world == local_world, or Options::attempt null): the buddy copy is a second file
//     in the same directory, written by rank r itself. It covers a lost process, not a lost host;
//     the log says so at start.
//   * Several hosts: the buddy's worker holds the copy in ITS host's directory (file
//     rank-<r>.buddy-<buddy>, created from the layout rank r publishes), registers the file's
//     mapping with its onesided Agent (runtime/onesided/agent.h; an Agent per Replicas, agents
//     named replica<rank> under the attempt's replica_onesided/ keys) and publishes the region's
//     descriptor under the attempt-scoped key replica_held/<r>/<buddy> (job/keys.h). Rank r's
//     transfer thread puts each step there: the target slot's commit record cleared and the
//     payload, a flush (Agent::Notify: every put before it is in the buddy's memory), then the
//     commit record (step, checksum, committed = 1) and another flush, so a writer killed mid-put
//     leaves that slot uncommitted and the other slot (the previous step) intact; a record torn by
//     the holder's own death fails the checksum every reader verifies. A lost host then costs nothing beyond K-1 steps: its ranks' own files
//     are gone, their buddies on other hosts hold the copies; two hosts lost together lose both
//     copies of some rank (a rank and its buddy), and the job falls back to disk checkpoints.
//
// Recovery: at Open every holder reopens the copies it holds (the primary one and any other
// rank-<r>.buddy-<h> file in its directory, left by an earlier placement), registers and publishes
// them; AgreeReplicaStep counts a step as restorable for rank r when r holds it locally or any rank
// holds it for r. Connect (after the agreement) joins the agents that exchange state: each rank
// with its buddy and the rank it holds for, and each rank that must pull with the holder chosen
// by the agreement. Restore takes the own copy, else a local buddy copy, else gets the holder's
// slot over the network into its own file (checksum verified, then committed there) and restores
// from that. The log names the path (own / buddy on this host / buddy over the network / disk);
// counts() carries it into the metrics (replica_resumed_from_network, replica_network_bytes; no
// disk_checkpoint_reads on the memory paths).
//
// Fencing (who can write a held copy): (1) descriptors live under attempt-scoped keys, so a rank
// of an older attempt only ever sees its own attempt's descriptors; (2) every attempt's holder is a
// new process with a new Agent whose registration draws a new random region token
// (onesided/descriptor.h): a put carrying an older attempt's token is refused by the holder's agent
// (Agent::refused_puts) and writes nothing; (3) the daemons kill an older attempt's workers before
// the next attempt starts, and store writes of older attempts are fenced (job/keys.h). UCX's TCP
// transport itself has no authentication (agent.h "Exposure"): keep multi-host jobs on a trusted
// network.
//
// Timing: Save copies the state into the own file's free slot on the training thread (a memcpy),
// checksums and commits it there (so once Save returns, the step's own copy is committed); then a
// transfer thread copies it into the buddy's file (a memcpy on one host, puts across hosts) and
// commits that, overlapped with the next step. The next Save first waits for that transfer (and
// returns its error: a buddy that is gone fails the step, which restarts the job), so at most one
// is in flight and each file always holds one complete committed step besides the one being
// written (double buffering).
//
// Memory per rank: its own file plus the copy it holds for another rank (each 2 x the state's
// payload + 4 KiB, in /dev/shm; across hosts the own file has 3 slots: the other ranks can save
// step s+1 while this rank's buddy copy of s is in flight, then holding s-1 and s-2, and the
// newest common step s-1 must still be in every own file), reported at start and in
// replica_memory_bytes.
//
// Thread safety: every method from the training thread; the transfer thread is internal.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Replicas> r, Replicas::Open(plan, attempt, state));  // nullptr: off
//   ASSIGN_OR_RETURN(std::optional<int64_t> at, ResumeFromReplicas(plan, attempt, *r, state, loader));
//   if (r->Due(step)) RETURN_IF_ERROR(r->Save(step, state, loader));
#ifndef EMBER_RUNTIME_WORKER_REPLICAS_H_
#define EMBER_RUNTIME_WORKER_REPLICAS_H_

#include <cstdint>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/data/token_file.h"
#include "runtime/onesided/agent.h"
#include "runtime/store/client.h"
#include "runtime/worker/replica_file.h"
#include "runtime/worker/train_state.h"
#include "runtime/worker/trainer.h"

namespace ember::worker {

struct ReplicaAgreement;

class Replicas {
 public:
  struct Options {
    std::string dir;  // the job's replica directory (OpenReplicaDir checks it)
    int rank = 0, world = 1, local_world = 1;
    int64_t every_steps = 1;
    // Tests: called halfway through each copy with "own" or "buddy" (e.g. to kill the process
    // mid-transfer). Runs on the thread doing the copy.
    std::function<void(const std::string& stage)> test_hook;
    // The attempt's store (borrowed; outlives the Replicas). Set and world > local_world: the
    // buddy copy lives on the buddy's host (see above). Null: every file in this host's directory.
    store::Client* attempt = nullptr;
    absl::Duration timeout = absl::Seconds(60);  // store waits, connecting, each transfer stage
  };

  // The job's replicas for this rank (files created or reopened; what they already hold is kept
  // for ResumeFromReplicas). nullptr when fault_tolerance.replicas is not memory.
  static absl::StatusOr<std::unique_ptr<Replicas>> Open(const Plan& plan, store::Client& attempt, TrainState& state);
  static absl::StatusOr<std::unique_ptr<Replicas>> Open(const Options& o, TrainState& state);
  ~Replicas();  // waits for a transfer in flight

  // The buddy of `rank` (see above).
  static int BuddyOf(int rank, int world, int local_world);

  bool Due(int64_t step) const { return step % every_steps_ == 0; }
  // Copies the state after optimizer step `step` (host memory: SyncHost first) into the own file,
  // commits it, and starts the buddy copy. Returns the previous transfer's error, if any.
  absl::Status Save(int64_t step, TrainState& state, const data::TokenLoader& loader);
  // Waits for the transfer in flight (the job's end; tests) and returns its error (a cross-host
  // put that failed: UNAVAILABLE when the buddy is gone; a local copy cannot fail).
  absl::Status Wait();

  // Steps whose state this rank can restore from this host: committed and checksum-verified in its
  // own file or in a buddy copy in this host's directory; newest first.
  std::vector<int64_t> Available() const;
  // Cross-host: the steps of the copies this rank holds for others (rank -> committed steps,
  // checksum-verified, newest first). Empty on one host.
  std::map<int, std::vector<int64_t>> Held() const;
  // Cross-host: connects this rank's agent to the peers it exchanges state with (its buddy, the
  // rank it holds for, and the pulls `a` decided) and imports the buddy's region for Save. Every
  // rank must call it after the agreement (the agents pair up). OK and nothing on one host.
  absl::Status Connect(const ReplicaAgreement& a);
  // Restores the state of `step` (own copy, else a buddy copy on this host, else the holder
  // Connect named, over the network): shards, AdamW state, optimizer step, loader position.
  // Returns where it came from ("own", "buddy rank 3's"; counts().from_network: over the network);
  // NOT_FOUND when none holds it.
  absl::StatusOr<std::string> Restore(int64_t step, TrainState& state, data::TokenLoader& loader);
  bool cross_host() const { return agent_ != nullptr; }
  int held_for() const { return held_for_; }
  // Cross-host: the agent (tests: refused_puts).
  onesided::Agent* agent() const { return agent_.get(); }

  ReplicaCounts& counts() { return counts_; }
  int buddy() const { return buddy_; }

 private:
  Replicas(const Options& o, int dirfd, int64_t payload, uint64_t fingerprint,
           std::unique_ptr<ReplicaFile> own, std::unique_ptr<ReplicaFile> copy);
  void Transfer(int own_slot, int64_t step, uint64_t checksum);
  absl::Status SetUpCrossHost();
  void OpenOtherCopies(bool cross_host);
  absl::Status PutToBuddy(int own_slot, int64_t step, uint64_t checksum);
  absl::StatusOr<onesided::RemoteRegion> ImportHeld(int rank, int holder);
  absl::StatusOr<std::vector<ReplicaFile::Slot>> RemoteRecords(onesided::Connection* c, onesided::RemoteRegion r);
  absl::Status PullFromHolder(int64_t step);

  const Options opts_;
  const int dirfd_;
  const int64_t payload_;
  const uint64_t fingerprint_;
  const int buddy_;
  int64_t every_steps_;
  std::unique_ptr<ReplicaFile> own_, copy_;  // copy_: held for this rank by its buddy (one host)
  // Buddy copies of this rank's state left in this directory by other holders (earlier placements).
  std::vector<std::unique_ptr<ReplicaFile>> local_copies_;
  std::thread transfer_;
  int64_t in_flight_ = -1;  // the step the transfer thread is committing
  absl::Status transfer_status_;
  ReplicaCounts counts_;

  // Cross-host only (agent_ set).
  struct HeldCopy {
    int rank = -1;
    std::unique_ptr<ReplicaFile> file;
    onesided::Registration reg;
  };
  int held_for_ = -1;       // the rank whose buddy this rank is
  std::vector<HeldCopy> held_;  // one per rank held for
  std::vector<uint8_t> scratch_;  // commit records to put, records got
  onesided::Registration own_reg_, scratch_reg_;
  std::map<int, onesided::Connection*> conns_;
  onesided::RemoteRegion buddy_region_;
  int buddy_newest_ = -1;  // the buddy copy's slot holding the newest commit (-1: none)
  int pull_from_ = -1;     // the holder Restore pulls from (Connect)
  std::atomic<bool> stop_{false};
  std::thread drain_;  // discards the flush notifications writers send this holder
  std::unique_ptr<onesided::Agent> agent_;
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
// `held` (cross-host): the steps of the copies this rank holds for others (Replicas::Held), also
// published ("disk=<d>;<steps>;<r>:<s>.<s>/<r>:<s>"); a step counts for rank r when r holds it
// or any rank holds it for r, and `pull_from` names, for each rank that does not hold the agreed
// step itself, the lowest rank holding it for that rank.
struct ReplicaAgreement {
  int64_t step = -1;
  int64_t disk_step = 0;
  std::map<int, int> pull_from;  // rank -> holder it restores from over the network
};
absl::StatusOr<ReplicaAgreement> AgreeReplicaStep(store::Client& attempt, int rank, int world,
                                                  const std::vector<int64_t>& mine, int64_t disk_step,
                                                  absl::Duration timeout,
                                                  const std::map<int, std::vector<int64_t>>& held = {});

// The resume hook of the training loop: agree on a step, and restore it unless a disk checkpoint
// is newer (by its directory name; nothing on disk is read); cross-host, Connect in every case.
// Returns the step resumed after, or nullopt to fall back to disk checkpoints; logs the path taken
// and fills counts().
absl::StatusOr<std::optional<int64_t>> ResumeFromReplicas(const Plan& plan, store::Client& attempt,
                                                          Replicas& replicas, TrainState& state,
                                                          data::TokenLoader& loader);

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_REPLICAS_H_
