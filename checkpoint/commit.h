// The commit protocol a checkpoint save runs across ranks (a two-phase commit through the store):
//
//   every rank:  Claim(N, rank) (fencing); write data + manifest into <root>/.tmp-step-N/, then
//                MarkDone(N, rank, token)
//   rank 0:      WaitAllDone(N) -> tokens; verify manifests; write metadata.json last (fsync file and
//                dir); rename to <root>/step-N; move `latest`; Publish(N, "ok" | "error: ...")
//   other ranks: WaitOutcome(N) -> "ok" means committed; anything else (or a timeout) is a failure.
//
// A rank that fails before voting votes "error: <why>" so rank 0 aborts at once instead of timing
// out. Keys (under the client's prefix, which scopes job and attempt): ckpt/<N>/done/<rank>,
// ckpt/<N>/claim/<rank>, ckpt/<N>/outcome. One save per step per prefix. Implementations are
// thread-safe.
#ifndef EMBER_CHECKPOINT_COMMIT_H_
#define EMBER_CHECKPOINT_COMMIT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/store/client.h"

namespace ember::ckpt {

class CommitProtocol {
 public:
  virtual ~CommitProtocol() = default;
  virtual absl::Status MarkDone(int64_t step, int rank, const std::string& token) = 0;
  // Rank 0: blocks until all `world` ranks voted; returns the tokens by rank. DEADLINE_EXCEEDED
  // names the ranks that did not vote.
  virtual absl::StatusOr<std::vector<std::string>> WaitAllDone(int64_t step, int world,
                                                               absl::Duration timeout) = 0;
  // Every rank before it writes anything for the step, and rank 0 again right before the rename
  // that makes step-N (and `latest`) visible: an error aborts the save. The store protocol writes
  // ckpt/<N>/claim/<rank>, so a rank whose client is fenced off by a newer attempt (store
  // FAILED_PRECONDITION "write refused by fence") writes no file into the directory the new
  // attempt resumes from. Default: OK.
  virtual absl::Status Claim(int64_t step, int rank) { return absl::OkStatus(); }
  virtual absl::Status Publish(int64_t step, const std::string& outcome) = 0;
  virtual absl::StatusOr<std::string> WaitOutcome(int64_t step, absl::Duration timeout) = 0;
  // Drops the keys of a finished step (called by rank 0 for the previous save).
  virtual absl::Status Forget(int64_t step) = 0;
};

// In-process protocol for ranks that are threads of one process (tests, world size 1).
class LocalCommitProtocol : public CommitProtocol {
 public:
  absl::Status MarkDone(int64_t step, int rank, const std::string& token) override;
  absl::StatusOr<std::vector<std::string>> WaitAllDone(int64_t step, int world,
                                                       absl::Duration timeout) override;
  absl::Status Publish(int64_t step, const std::string& outcome) override;
  absl::StatusOr<std::string> WaitOutcome(int64_t step, absl::Duration timeout) override;
  absl::Status Forget(int64_t step) override;

 private:
  absl::Mutex mu_;
  std::map<int64_t, std::map<int, std::string>> done_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::string> outcome_ ABSL_GUARDED_BY(mu_);
};

// The real thing: votes and outcome are keys in the rendezvous store.
class StoreCommitProtocol : public CommitProtocol {
 public:
  explicit StoreCommitProtocol(store::Client client) : client_(std::move(client)) {}
  absl::Status MarkDone(int64_t step, int rank, const std::string& token) override;
  absl::StatusOr<std::vector<std::string>> WaitAllDone(int64_t step, int world,
                                                       absl::Duration timeout) override;
  absl::Status Claim(int64_t step, int rank) override;
  absl::Status Publish(int64_t step, const std::string& outcome) override;
  absl::StatusOr<std::string> WaitOutcome(int64_t step, absl::Duration timeout) override;
  absl::Status Forget(int64_t step) override;

 private:
  store::Client client_;  // thread-safe handle
};

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_COMMIT_H_
