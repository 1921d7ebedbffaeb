// Clock: the source of time for every component, injectable so tests can fake it.
//
// RealClock() is process-wide and thread-safe. FakeClock is thread-safe; Advance() wakes any
// thread sleeping in SleepFor/SleepUntil whose deadline has passed.
//
//   ember::base::FakeClock clock;          // starts at a fixed epoch
//   Store store(&clock);                   // borrowed; must outlive store
//   clock.Advance(absl::Seconds(31));      // leases expire deterministically
#ifndef EMBER_RUNTIME_BASE_CLOCK_H_
#define EMBER_RUNTIME_BASE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ember::base {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Monotonic-ish nanoseconds for intervals (steady for RealClock).
  virtual int64_t MonotonicNanos() const = 0;
  virtual void SleepFor(absl::Duration d) = 0;
  // Blocks the calling thread until Now() >= t.
  virtual void SleepUntil(absl::Time t) = 0;
};

// The real wall clock (absl::Now) with a steady monotonic counter. Never deleted.
Clock* RealClock();

// A manual clock for tests. Time moves only through Advance()/SetTime().
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000));
  absl::Time Now() const override;
  int64_t MonotonicNanos() const override;
  void SleepFor(absl::Duration d) override;
  void SleepUntil(absl::Time t) override;
  void Advance(absl::Duration d);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Time start_;
};

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_CLOCK_H_
