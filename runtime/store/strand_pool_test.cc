// StrandPool: order within a strand, parallelism across strands, cancellation of queued tasks.
#include "runtime/store/strand_pool.h"

#include <atomic>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace ember::store {
namespace {

TEST_CASE("tasks of one strand run in order, one at a time; strands run in parallel") {
  StrandPool pool(4);
  absl::Mutex mu;
  std::vector<std::vector<int>> seen(3);
  std::atomic<int> running_in_strand0{0}, overlap{0}, done{0};
  for (int i = 0; i < 300; ++i) {
    const int strand = i % 3;
    pool.Post(
        strand,
        [&, strand, i] {
          if (strand == 0 && running_in_strand0.fetch_add(1) != 0) ++overlap;
          {
            absl::MutexLock l(&mu);
            seen[strand].push_back(i);
          }
          if (strand == 0) running_in_strand0.fetch_sub(1);
          ++done;
        },
        [] { FAIL("nothing is cancelled here"); });
  }
  // Two strands block each other only if they share a thread: both must be running at once.
  absl::Notification a_started, b_started;
  std::atomic<bool> met_a{false}, met_b{false};
  pool.Post(
      7,
      [&] {
        a_started.Notify();
        met_a = b_started.WaitForNotificationWithTimeout(absl::Seconds(10));
      },
      [] {});
  pool.Post(
      8,
      [&] {
        b_started.Notify();
        met_b = a_started.WaitForNotificationWithTimeout(absl::Seconds(10));
      },
      [] {});
  for (int i = 0; i < 1000 && done < 300; ++i) absl::SleepFor(absl::Milliseconds(10));
  REQUIRE(done == 300);
  REQUIRE(overlap == 0);
  for (int i = 0; i < 1000 && !(met_a && met_b); ++i) absl::SleepFor(absl::Milliseconds(10));
  REQUIRE(met_a);
  REQUIRE(met_b);
  absl::MutexLock l(&mu);
  for (int s = 0; s < 3; ++s) {
    REQUIRE(seen[s].size() == 100);
    for (int k = 0; k < 100; ++k) REQUIRE(seen[s][k] == 3 * k + s);
  }
}

TEST_CASE("Drop cancels a strand's queued tasks; Stop cancels the rest") {
  StrandPool pool(1);
  absl::Notification release;
  std::atomic<int> ran{0}, cancelled{0};
  pool.Post(1, [&] { release.WaitForNotification(); ++ran; }, [&] { ++cancelled; });
  absl::SleepFor(absl::Milliseconds(50));  // the first task is running now
  for (int i = 0; i < 5; ++i) pool.Post(1, [&] { ++ran; }, [&] { ++cancelled; });
  pool.Drop(1);
  REQUIRE(cancelled == 5);
  for (int i = 0; i < 3; ++i) pool.Post(2, [&] { ++ran; }, [&] { ++cancelled; });
  release.Notify();
  pool.Stop();
  REQUIRE(ran + cancelled == 9);
  REQUIRE(ran >= 1);
  pool.Post(3, [&] { ++ran; }, [&] { ++cancelled; });  // after Stop: cancelled at once
  REQUIRE(ran + cancelled == 10);
}

TEST_CASE("a strand held by TryAcquire runs its posted tasks only after Release") {
  StrandPool pool(2);
  REQUIRE(pool.TryAcquire(5));
  REQUIRE_FALSE(pool.TryAcquire(5));  // held
  std::atomic<int> ran{0};
  absl::Notification done;
  pool.Post(5, [&] { ++ran; }, [] { FAIL("not cancelled"); });
  pool.Post(5, [&] { ++ran; done.Notify(); }, [] { FAIL("not cancelled"); });
  absl::SleepFor(absl::Milliseconds(50));
  REQUIRE(ran == 0);
  REQUIRE(pool.TryAcquire(6));  // other strands are free
  pool.Release(6);
  pool.Release(5);
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  REQUIRE(ran == 2);
  // A strand with queued or running work cannot be taken.
  absl::Notification release, started;
  pool.Post(9, [&] { started.Notify(); release.WaitForNotification(); }, [] {});
  REQUIRE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  REQUIRE_FALSE(pool.TryAcquire(9));
  release.Notify();
  pool.Stop();
  REQUIRE_FALSE(pool.TryAcquire(10));  // stopped
}

TEST_CASE("ReleaseWith runs its task before the tasks posted while the strand was held") {
  StrandPool pool(2);
  REQUIRE(pool.TryAcquire(3));
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification done;
  pool.Post(3, [&] { absl::MutexLock l(&mu); order.push_back(2); done.Notify(); }, [] {});
  pool.ReleaseWith(3, [&] { absl::MutexLock l(&mu); order.push_back(1); }, [] {});
  REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  {
    absl::MutexLock l(&mu);
    REQUIRE(order == std::vector<int>{1, 2});
  }
  REQUIRE(pool.TryAcquire(4));
  pool.Stop();
  std::atomic<bool> cancelled{false};
  pool.ReleaseWith(4, [] { FAIL("the pool stopped"); }, [&] { cancelled = true; });
  REQUIRE(cancelled);
}

}  // namespace
}  // namespace ember::store
