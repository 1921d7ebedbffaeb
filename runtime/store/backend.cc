// Backend::Call's default: Execute and wait (see backend.h).
#include "runtime/store/backend.h"

#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace ember::store {

v1::Response Backend::AwaitAnswer(const std::function<void(const Done&)>& start) {
  struct Slot {
    absl::Mutex mu;
    bool answered ABSL_GUARDED_BY(mu) = false;
    v1::Response out ABSL_GUARDED_BY(mu);
  };
  // Shared: `done` may still be unlocking when the waiter returns.
  auto slot = std::make_shared<Slot>();
  start([slot](v1::Response r) {
    absl::MutexLock l(&slot->mu);
    slot->out = std::move(r);
    slot->answered = true;
  });
  absl::MutexLock l(&slot->mu);
  slot->mu.Await(absl::Condition(&slot->answered));
  return std::move(slot->out);
}

v1::Response Backend::Call(const v1::Request& request, uint64_t owner) {
  return AwaitAnswer([&](const Done& done) { Execute({&request}, done, owner); });
}

}  // namespace ember::store
