#include "runtime/onesided/work.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/flight/recorder.h"

namespace ember::onesided {
namespace internal {

std::string WorkState::what() const {
  if (desc_.peer.empty()) return desc_.op;
  return absl::StrCat(desc_.op, " of ", desc_.bytes, " bytes",
                      desc_.regions >= 0 ? absl::StrCat(" in ", desc_.regions, " regions") : "",
                      " ", desc_.direction, " ", desc_.peer);
}

void WorkState::SetRecord(flight::FlightRecorder* fr, uint64_t record_id) {
  absl::MutexLock l(&mu_);
  fr_ = fr;
  record_id_ = record_id;
  if (fr_ != nullptr) fr_->Start(record_id_);
}

void WorkState::AddParts(int n) {
  absl::MutexLock l(&mu_);
  pending_ += n;
}

void WorkState::PartDone(absl::Status st) {
  absl::MutexLock l(&mu_);
  if (!st.ok() && status_.ok()) status_ = std::move(st);
  if (--pending_ > 0) return;
  if (fr_ == nullptr) return;
  if (status_.ok()) {
    fr_->Complete(record_id_);
  } else {
    fr_->Fail(record_id_, status_.message());
  }
}

bool WorkState::done() const {
  absl::MutexLock l(&mu_);
  return pending_ <= 0;
}

void Progressor::LeaveSpin(bool wake) {
  left_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_release);
  if (spinning_.fetch_sub(1, std::memory_order_acq_rel) == 1 && wake) Kick();
}

bool Progressor::waiter_active(absl::Duration grace) const {
  return waiter_spinning() ||
         absl::GetCurrentTimeNanos() - left_ns_.load(std::memory_order_acquire) < absl::ToInt64Nanoseconds(grace);
}

void Progressor::Kick() {
  kicked_.store(true, std::memory_order_release);
  absl::MutexLock l(&park_mu_);  // releasing it re-evaluates the parked thread's condition
}

bool Progressor::Park(absl::Duration max) {
  auto kicked = [this] { return kicked_.load(std::memory_order_acquire); };
  if (!kicked()) {
    park_mu_.LockWhenWithTimeout(absl::Condition(&kicked), max);
    park_mu_.Unlock();
  }
  return kicked_.exchange(false, std::memory_order_acq_rel);
}

bool SpinUntil(Progressor* p, absl::FunctionRef<bool()> done, absl::Duration timeout, absl::Time* start) {
  *start = absl::InfinitePast();
  if (p == nullptr) return done();
  // Passes per batch: the clock is read once per batch (a pass over shared memory takes ~50 ns).
  constexpr int kPassesPerBatch = 64;
  p->EnterSpin();
  bool ok = done() || p->ProgressUntil(done, kPassesPerBatch);
  if (!ok) {
    *start = absl::Now();
    const absl::Time until = *start + std::min(timeout, kSpinBudget);
    do {
      ok = p->ProgressUntil(done, kPassesPerBatch);
    } while (!ok && absl::Now() < until);
  }
  p->LeaveSpin(/*wake=*/!ok);
  return ok;
}

absl::Status WorkState::Wait(absl::Duration timeout, WaitStyle style) {
  {
    absl::MutexLock l(&mu_);
    if (pending_ <= 0) return status_;  // finished already (an eager notify, an argument error)
  }
  const absl::Duration asked = timeout;
  absl::Time start = absl::InfinitePast();
  if (style == WaitStyle::kSpin) {
    SpinUntil(progressor_.get(), [this] { return done(); }, timeout, &start);
  } else if (progressor_ != nullptr) {
    progressor_->Kick();  // nobody drives this transfer but the progress thread: now, not after its grace
  }
  if (start == absl::InfinitePast()) start = absl::Now();
  const absl::Time deadline = start + timeout;
  absl::MutexLock l(&mu_);
  timeout = std::max(absl::ZeroDuration(), deadline - absl::Now());
  auto finished = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return pending_ <= 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&finished), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        what(), ": not complete after ", absl::FormatDuration(asked),
        " (started ", absl::FormatDuration(absl::Now() - start_),
        " ago); its outcome is unknown and the destination may be partly written. Keep the "
        "local buffer registered until a later Wait returns, or destroy the Agent"));
  }
  return status_;
}

}  // namespace internal

Work Work::Finished(absl::Status status) {
  if (status.ok()) return Work(nullptr);  // no state to allocate or share (a notify's fast path)
  auto s = std::make_shared<internal::WorkState>(internal::WorkState::Desc{}, 1);
  s->PartDone(std::move(status));
  return Work(std::move(s));
}

absl::Status Work::Wait(absl::Duration timeout, WaitStyle style) const {
  return state_ == nullptr ? absl::OkStatus() : state_->Wait(timeout, style);
}
bool Work::Done() const { return state_ == nullptr || state_->done(); }

}  // namespace ember::onesided
