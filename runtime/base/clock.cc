#include "runtime/base/clock.h"

#include <chrono>

namespace ember::base {
namespace {
class RealClockImpl : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  int64_t MonotonicNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
  void SleepUntil(absl::Time t) override {
    absl::Duration d = t - absl::Now();
    if (d > absl::ZeroDuration()) absl::SleepFor(d);
  }
};
}  // namespace

Clock* RealClock() {
  static Clock* clock = new RealClockImpl();
  return clock;
}

FakeClock::FakeClock(absl::Time start) : now_(start), start_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock l(&mu_);
  return now_;
}

int64_t FakeClock::MonotonicNanos() const {
  absl::MutexLock l(&mu_);
  return absl::ToInt64Nanoseconds(now_ - start_);
}

void FakeClock::SleepFor(absl::Duration d) { SleepUntil(Now() + d); }

void FakeClock::SleepUntil(absl::Time t) {
  absl::MutexLock l(&mu_);
  auto reached = [this, t]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return now_ >= t; };
  mu_.Await(absl::Condition(&reached));
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock l(&mu_);
  now_ += d;
}

}  // namespace ember::base
