// Work: the handle of one asynchronous communication op.
//
// Completion is one-shot: the op's status (OK or the error, e.g. DEADLINE_EXCEEDED from the
// watchdog, UNAVAILABLE when a peer died, ABORTED when the group was aborted) is set exactly once.
// Thread-safe: any thread may Wait/IsCompleted concurrently.
//
//   std::shared_ptr<Work> w = pg->AllReduce(buf, n, DataType::kF32, ReduceOp::kSum);
//   RETURN_IF_ERROR(w->Wait());
//
// Stream semantics: for the cpu backend an op is complete when the data is in the caller's buffer.
// A device backend completes Work when the op has been enqueued on the group's stream and
// Wait() makes the caller's current stream wait on it (the NCCL convention): the backend attaches
// the op's DeviceEvents before completing the Work; Wait(timeout, /*block_host=*/true) also blocks
// the host until the device finished the op.
#ifndef EMBER_RUNTIME_COMM_WORK_H_
#define EMBER_RUNTIME_COMM_WORK_H_

#include <atomic>
#include <cstdint>
#include <string>

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ember::comm {

// The start/end events of one device op (CUDA events recorded on the op's stream). Thread-safe.
class DeviceEvents {
 public:
  virtual ~DeviceEvents() = default;
  // Makes the calling thread's current stream wait for the op's end event (no host sync).
  virtual absl::Status StreamWait() = 0;
  // Blocks the host until the op finished on the device, or `timeout` passes.
  virtual absl::Status Synchronize(absl::Duration timeout) = 0;
  // True once the op finished on the device.
  virtual bool Done() = 0;
  // Device start/end times (CLOCK_REALTIME ns, from the events' elapsed time anchored at the
  // enqueue time); false until Done().
  virtual bool TimesNs(int64_t* start_ns, int64_t* end_ns) = 0;
};

class Work {
 public:
  Work(std::string op, int64_t seq) : op_(std::move(op)), seq_(seq) {}
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the op completes (returns its status) or `timeout` passes (returns
  // DEADLINE_EXCEEDED; the op keeps running and the group's watchdog still applies). Spins briefly
  // before sleeping so short ops return with low latency.
  // Device ops: then makes the current stream wait on the op, or with block_host, blocks until the
  // device finished it.
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration(), bool block_host = false);
  bool IsCompleted() const { return done_.load(std::memory_order_acquire); }
  // The final status; OK while still running.
  absl::Status status() const;
  const std::string& op() const { return op_; }
  // Collective seq (or p2p seq for send/recv) within the group.
  int64_t seq() const { return seq_; }

  // Sets the result (first call wins). Returns false if already completed.
  bool Finish(absl::Status s);
  // Device backends: attaches the op's events; call before Finish.
  void SetDeviceEvents(std::shared_ptr<DeviceEvents> e);
  std::shared_ptr<DeviceEvents> device_events() const;

 private:
  const std::string op_;
  const int64_t seq_;
  std::atomic<bool> done_{false};
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<DeviceEvents> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_WORK_H_
