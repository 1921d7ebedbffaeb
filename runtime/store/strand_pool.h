// StrandPool: a fixed pool of threads running tasks posted under a strand id; tasks of one strand
// run one at a time, in the order posted, tasks of different strands in parallel. The etcd backend
// runs each connection's requests on its own strand: answers keep request order per connection
// while many connections wait on etcd at once.
//
// Each task comes with `cancel`, run instead of it (on the caller's thread) when Drop() or Stop()
// discards it. Thread-safety: thread-safe. Stop() (and the destructor) joins the threads; tasks
// running then finish first.
#ifndef EMBER_RUNTIME_STORE_STRAND_POOL_H_
#define EMBER_RUNTIME_STORE_STRAND_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace ember::store {

class StrandPool {
 public:
  explicit StrandPool(int threads);
  ~StrandPool() { Stop(); }

  void Post(uint64_t strand, std::function<void()> run, std::function<void()> cancel);
  // Lets the calling thread run the strand's next piece of work itself: true when the strand had
  // nothing queued or running (it is then held as running until Release, and tasks posted
  // meanwhile wait for Release); false when it is busy or the pool stopped (post instead).
  bool TryAcquire(uint64_t strand);
  void Release(uint64_t strand);  // after a TryAcquire that returned true
  // Release, with `run` to go first among the strand's tasks (on a pool thread; `cancel` instead,
  // on this thread, if the pool stopped).
  void ReleaseWith(uint64_t strand, std::function<void()> run, std::function<void()> cancel);
  void Drop(uint64_t strand);  // cancels the strand's tasks not yet started
  void Stop();                 // cancels every task not yet started

 private:
  struct Task {
    std::function<void()> run, cancel;
  };
  struct Strand {
    std::deque<Task> tasks;
    bool running = false;  // a thread owns the strand now
  };
  void Loop();

  absl::Mutex mu_;
  std::map<uint64_t, Strand> strands_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> ready_ ABSL_GUARDED_BY(mu_);  // strands with tasks and no thread
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_STRAND_POOL_H_
