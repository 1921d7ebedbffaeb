// ember::onesided::Work: the handle of one transfer (Put, Get or Notify). Copyable; copies share
// the state. Thread-safe: any thread may Wait, concurrently.
//
// Wait(timeout) returns OK only when every part of the transfer completed; the first UCX error
// otherwise (UNAVAILABLE for a failed peer); DEADLINE_EXCEEDED when `timeout` passes first, in
// which case the transfer is still in flight and the destination's contents are unknown (possibly
// partly written): the caller must not reuse or free the local buffer until a later Wait returns
// something else or the Agent is destroyed (which ends every request with an error).
#ifndef EMBER_RUNTIME_ONESIDED_WORK_H_
#define EMBER_RUNTIME_ONESIDED_WORK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ember::flight {
class FlightRecorder;
}

namespace ember::onesided {

namespace internal {
// Lets a waiting thread drive the agent's UCX worker itself (what the agent's progress thread
// does otherwise): the waiter then needs no thread hand-off, and the progress thread stays out of
// its way. Implemented by the agent; outlives it (Progress() returns false once it is gone).
class Progressor {
 public:
  virtual ~Progressor() = default;
  // One progress pass; true when something happened.
  virtual bool Progress() = 0;
  std::atomic<int> spinning{0};  // threads inside a spin phase (the progress thread then sleeps)
};

// How long Wait/WaitNotification drive progress themselves before blocking on a condition
// variable (and leaving progress to the agent's thread).
inline constexpr absl::Duration kSpinBudget = absl::Milliseconds(20);

// Runs `done` checks while driving `p` for at most min(kSpinBudget, until deadline); true when
// `done` turned true.
bool SpinUntil(Progressor* p, const std::function<bool()>& done, absl::Time deadline);

// Shared by a Work and the UCX requests of its transfer (each request holds a reference).
class WorkState {
 public:
  WorkState(std::string what, int parts, std::shared_ptr<Progressor> progressor = nullptr)
      : what_(std::move(what)), progressor_(std::move(progressor)), pending_(parts) {}
  // Flight-recorder entry to complete/fail when the transfer ends (0 = none).
  void SetRecord(flight::FlightRecorder* fr, uint64_t record_id);
  // One part finished with `st` (the first error wins). The last part ends the transfer.
  void PartDone(absl::Status st);
  // Adds parts before the transfer can finish (e.g. the notify message after the flush).
  void AddParts(int n);
  absl::Status Wait(absl::Duration timeout);
  bool done() const;
  const std::string& what() const { return what_; }

 private:
  const std::string what_;  // "put of 4096 bytes in 2 regions to rank1"
  const std::shared_ptr<Progressor> progressor_;
  mutable absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  flight::FlightRecorder* fr_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t record_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time start_ = absl::Now();
};
}  // namespace internal

class Work {
 public:
  // A finished Work carrying `status` (argument errors, empty transfers).
  static Work Finished(absl::Status status);
  explicit Work(std::shared_ptr<internal::WorkState> state) : state_(std::move(state)) {}

  absl::Status Wait(absl::Duration timeout) const;
  bool Done() const;

 private:
  std::shared_ptr<internal::WorkState> state_;
};

}  // namespace ember::onesided

#endif  // EMBER_RUNTIME_ONESIDED_WORK_H_
