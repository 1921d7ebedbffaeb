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
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ember::flight {
class FlightRecorder;
}

namespace ember::onesided {

// How a waiting thread waits (Work::Wait, Agent::WaitNotification).
enum class WaitStyle {
  // Latency first: drive UCX progress on this thread for up to kSpinBudget (20 ms), then block.
  // A reply that arrives meanwhile is seen within a microsecond, at the price of a busy core.
  kSpin,
  // CPU first: block at once and leave progress to the agent's thread (tens of microseconds more
  // per wake-up). For background threads beside compute, e.g. weight publishing.
  kBlock,
};

namespace internal {
// Lets a waiting thread drive the agent's UCX worker itself (what the agent's progress thread
// does otherwise): the waiter then needs no thread hand-off, and the progress thread stays out of
// its way. Implemented by the agent; outlives it (ProgressUntil() returns false once it is gone).
class Progressor {
 public:
  virtual ~Progressor() = default;
  // Progress passes until `done()` holds after one (true) or `max_passes` passed or the worker is
  // gone (false). One call per batch: a spinning waiter pays the implementation's locking once per
  // batch, not once per pass (the lock and unlock of every pass were a third of a waiter's samples
  // in a notify ping-pong, most of the time it took to see the message).
  virtual bool ProgressUntil(absl::FunctionRef<bool()> done, int max_passes) = 0;
  // A waiter enters/leaves its spin phase. `wake`: the waiter is about to block (its spin budget
  // ran out), so the last one to leave wakes a parked progress thread at once (Kick); a waiter
  // whose spin succeeded leaves it parked (no system call on the fast path).
  void EnterSpin() { spinning_.fetch_add(1, std::memory_order_acq_rel); }
  void LeaveSpin(bool wake);
  bool waiter_spinning() const { return spinning_.load(std::memory_order_acquire) > 0; }
  // Whether a waiter spins now or left its spin phase less than `grace` ago: a thread in a
  // request/reply loop is between two waits and will drive the worker again in microseconds.
  bool waiter_active(absl::Duration grace) const;
  // Wakes a parked progress thread: requests were left in flight with nobody waiting on them.
  void Kick();
  // The progress thread: blocks until Kick() or `max` (no periodic wake-ups competing with a
  // waiter for a core, and no wake-up per arriving message, which a thread asleep on the worker's
  // event fd would get). Returns whether it was kicked.
  bool Park(absl::Duration max);

 private:
  std::atomic<int> spinning_{0};          // threads inside a spin phase
  std::atomic<int64_t> left_ns_{0};       // when the last spin phase ended (absl::GetCurrentTimeNanos)
  std::atomic<bool> kicked_{false};
  absl::Mutex park_mu_;                   // the progress thread parks on it; guards nothing
};

// How long Wait/WaitNotification drive progress themselves before blocking on a condition
// variable (and leaving progress to the agent's thread).
inline constexpr absl::Duration kSpinBudget = absl::Milliseconds(20);
// How long the progress thread stays parked while a waiter is active before it looks again, and
// how recently a waiter must have spun to count as active (Progressor::waiter_active).
inline constexpr absl::Duration kParkSlice = absl::Milliseconds(1);
inline constexpr absl::Duration kWaiterGrace = absl::Milliseconds(1);

// Runs `done` checks while driving `p` for at most min(kSpinBudget, timeout); true when `done`
// turned true. `*start`: when the spin began, read only after a first batch of passes did not end
// it (a ping-pong's reply usually comes within one, and the clock reads were a tenth of its
// time); absl::InfinitePast() when it never read the clock (the caller reads it if it needs it).
bool SpinUntil(Progressor* p, absl::FunctionRef<bool()> done, absl::Duration timeout, absl::Time* start);

// Shared by a Work and the UCX requests of its transfer (each request holds a reference).
class WorkState {
 public:
  // What the transfer is, for messages; the text is built only when one is needed (an error, a
  // flight-recorder entry), not on the fast path.
  struct Desc {
    const char* op = "transfer";  // "put", "get", "notification"
    uint64_t bytes = 0;
    int regions = -1;             // -1: not shown
    const char* direction = "to";
    std::string peer;
  };
  WorkState(Desc desc, int parts, std::shared_ptr<Progressor> progressor = nullptr)
      : desc_(std::move(desc)), progressor_(std::move(progressor)), pending_(parts) {}
  // Flight-recorder entry to complete/fail when the transfer ends (0 = none).
  void SetRecord(flight::FlightRecorder* fr, uint64_t record_id);
  // One part finished with `st` (the first error wins). The last part ends the transfer.
  void PartDone(absl::Status st);
  // Adds parts before the transfer can finish (e.g. the notify message after the flush).
  void AddParts(int n);
  absl::Status Wait(absl::Duration timeout, WaitStyle style = WaitStyle::kSpin);
  bool done() const;
  // "put of 4096 bytes in 2 regions to rank1"
  std::string what() const;

 private:
  const Desc desc_;
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
  // `state` null: finished OK.
  explicit Work(std::shared_ptr<internal::WorkState> state) : state_(std::move(state)) {}

  absl::Status Wait(absl::Duration timeout, WaitStyle style = WaitStyle::kSpin) const;
  bool Done() const;

 private:
  std::shared_ptr<internal::WorkState> state_;  // null: finished OK (Finished)
};

}  // namespace ember::onesided

#endif  // EMBER_RUNTIME_ONESIDED_WORK_H_
