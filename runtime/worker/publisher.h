// Live weight publishing, the ranks' side (issue 16; the protocol is in weights_protocol.h, the
// overview in docs/onesided.md): with publish.every_steps = K > 0 in the job spec, every K-th
// optimizer step each rank copies its parameter shards into a registered staging buffer and its
// own thread puts them into every subscriber's buffer, notifies the step and waits for the ack.
//
// Training never waits on a subscriber: at a publish step the ranks agree (one 8-byte all-reduce)
// to publish only when every rank has a subscriber and its previous publish finished; otherwise
// every rank skips that step and counts it. A subscriber whose transfer fails or that does not ack
// within ack_timeout is dropped (its store key deleted). Counters: the attempt's
// WeightsStatsOf(rank) key ("published=P skipped=S dropped=D") and a log line at the end.
//
// Thread safety: AtStep from the training thread only.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Publisher> pub, StartPublisher(plan, attempt, *model));
//   RETURN_IF_ERROR(PublishAt(pub.get(), step));   // at each step boundary; nullptr: no-op
#ifndef EMBER_RUNTIME_WORKER_PUBLISHER_H_
#define EMBER_RUNTIME_WORKER_PUBLISHER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/worker/train_state.h"
#include "runtime/store/client.h"
#include "runtime/worker/step_io.h"
#include "runtime/worker/trainer.h"

namespace ember::worker {

class Publisher {
 public:
  virtual ~Publisher() = default;  // stops the thread, writes and logs the counters
  // At the end of optimizer step `step`. Errors only from the agreement collective.
  virtual absl::Status AtStep(int64_t step) = 0;
  // The counters so far (also in the progress record's `publish`). Thread-safe.
  virtual PublishCounts counts() const = 0;
};

// nullptr when plan.spec.publish.every_steps is 0. Otherwise rank 0 writes the manifest, and the
// agent and the publishing thread start. `attempt` (the attempt's store view) and `model` must
// outlive the Publisher.
absl::StatusOr<std::unique_ptr<Publisher>> StartPublisher(const Plan& plan, store::Client& attempt,
                                                          TrainState& model);

inline absl::Status PublishAt(Publisher* p, int64_t step) { return p ? p->AtStep(step) : absl::OkStatus(); }

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_PUBLISHER_H_
