// CpuCommDriver: a CommDriver (comm_driver.h) whose communicators are the cpu backend's, so the
// device backends' policy (device_backend.h) runs with real processes on CPU-only machines. It is
// a faithful fake of NCCL 2.28's non-blocking communicators where the policy can get them wrong:
//
// - Streams: every communicator has its own stream, a thread that runs what is enqueued on it in
//   order (FakeStream). Collectives run there later: when Collective/EndOp return, the op's end
//   event is usually not done. Before an op starts, the communicator's stream waits for what the
//   caller's stream (OpDesc::stream) had enqueued. The null stream is the legacy stream: a
//   collective or p2p submitted there is a violation (it would not order against the project's
//   non-blocking compute streams).
// - In progress: Collective returns InProgressError at random (probability
//   FakeNcclOptions::in_progress, seeded: the same seed gives the same draws in the same call
//   order); the op is then enqueued only after AsyncError has been polled 1-3 more times. Any
//   other call on that communicator meanwhile (Collective, EndOp, send/recv, Split, Shrink) is a
//   violation: on NCCL the end event would be recorded before the op and Work::Wait would return
//   early.
// - Events: an op's end event exists only after EndOp; StreamWait/Synchronize before it is
//   FAILED_PRECONDITION (cudaStreamWaitEvent on an event never recorded). Synchronize returns the
//   op's error if it failed on the stream (the error also becomes the communicator's async error).
// - Handles: Revoke (ncclCommRevoke) fails pending and later ops but keeps the handle; AsyncError
//   is then in progress until the stream is idle. Abort (ncclCommAbort) frees it: any later call,
//   including a second Abort, is a violation. Split/Shrink of a revoked parent that is not yet
//   quiescent is a violation.
// - Violations are loud: strict (the default) prints them and aborts the process; otherwise they
//   are recorded (Violations()) and the call fails with INTERNAL.
// P2P moves bytes on the cpu backend's p2p thread (not on the stream); `done` runs when they moved.
//
// A unique id is a random string; InitRank connects a cpu backend whose store keys live under
// cpucomm/<id>/. Split publishes (color, key) under cpucomm/<parent id>/split<n>/<rank> and the
// members read every rank's entry (a rank that never calls makes them fail with DEADLINE_EXCEEDED
// after the init timeout, not hang); Shrink connects the survivors under
// cpucomm/<parent id>/shrink<n>/<excluded>. Device times are the host's when the stream ran the
// start and end events.
//
// Test hooks: Log() lists what the driver did ("init main rank 0/2", "revoke p2p 0-1", ...),
// InjectAsyncError makes every communicator of this driver report an error to the watchdog,
// NewStream makes a stream for a test thread's SetCurrentStream.
// Thread-safe.
#ifndef EMBER_RUNTIME_COMM_CPU_COMM_DRIVER_H_
#define EMBER_RUNTIME_COMM_CPU_COMM_DRIVER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/comm/comm_driver.h"
#include "runtime/comm/rendezvous.h"

namespace ember::comm {

// A point on a FakeStream: done once the stream ran everything enqueued before it.
struct FakeEvent {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  int64_t time_ns ABSL_GUARDED_BY(mu) = 0;  // host time when the stream reached it
  void Set();
  bool IsDone();
  // False after `timeout`.
  bool WaitFor(absl::Duration timeout);
  int64_t time();
};

// A CUDA stream's ordering on the host: one thread runs the enqueued tasks in order.
// Thread-safe. The destructor runs what is queued (a wait for an event that never comes gives
// up), then joins.
class FakeStream {
 public:
  explicit FakeStream(std::string name);
  ~FakeStream();
  const std::string& name() const { return name_; }
  void Enqueue(std::function<void()> task);
  // cudaEventRecord: an event done when the stream reaches it.
  std::shared_ptr<FakeEvent> Record();
  // cudaStreamWaitEvent: later tasks start after `e` is done.
  void WaitEvent(std::shared_ptr<FakeEvent> e);
  // Blocks until everything enqueued so far ran; false after `timeout`.
  bool Synchronize(absl::Duration timeout);
  bool Idle();

 private:
  void Loop();
  const std::string name_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> q_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

struct FakeNcclOptions {
  bool strict = true;         // violations abort the process (tests); false: recorded, INTERNAL
  double in_progress = 0.3;   // probability that a collective returns in progress
  uint64_t seed = 1;          // of the in-progress draws and call latencies
  // Time a collective or AsyncError spends inside the "library" (uniform in [0, this)): a handle
  // freed by another thread meanwhile is a violation.
  absl::Duration call_latency = absl::Microseconds(200);
};

class CpuCommDriver : public CommDriver {
 public:
  // `base` supplies the cpu backends' transport options (host, shm); `rdzv` the store.
  CpuCommDriver(std::shared_ptr<Rendezvous> rdzv, BackendOptions base, FakeNcclOptions fake = {});
  ~CpuCommDriver() override;

  std::string name() const override { return "cpu-comm"; }
  absl::StatusOr<std::string> NewUniqueId() override;
  absl::StatusOr<std::unique_ptr<Communicator>> InitRank(const std::string& id, int rank, int size,
                                                         const CommInitOptions& o) override;
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> InitRanks(
      const std::string& id, const std::vector<int>& ranks, int size,
      const std::vector<std::string>& devices, const CommInitOptions& o) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Split(Communicator& parent, int color, int key,
                                                      const CommInitOptions& o) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(Communicator& parent,
                                                       const std::vector<int>& excluded,
                                                       const CommInitOptions& o) override;
  // Enqueues each op on its communicator; in progress if any of them is (poll each).
  absl::Status GroupCollective(const std::vector<Communicator*>& comms,
                               const std::vector<OpDesc>& ops) override;

  // A stream owned by the driver (lives as long as it), for SetCurrentStream.
  void* NewStream(const std::string& name);
  // The stream `s` stands for (nullptr: the legacy stream).
  FakeStream* StreamOf(void* s);

  // Test hooks.
  std::vector<std::string> Log() const;
  void Note(std::string line);
  void InjectAsyncError(absl::Status s);
  absl::Status injected() const;
  std::vector<std::string> Violations() const;
  // Records a violation (strict: prints it and aborts the process); returns it as INTERNAL.
  absl::Status Violation(const std::string& what);
  // One seeded draw: true with probability in_progress; `polls` gets 1..3.
  bool DrawInProgress(int* polls);
  int64_t InProgressCount() const;  // calls that returned in progress so far
  void InsideCall();                // sleeps a seeded fraction of call_latency
  const FakeNcclOptions& fake() const { return fake_; }

 private:
  const std::shared_ptr<Rendezvous> rdzv_;
  const BackendOptions base_;
  const FakeNcclOptions fake_;
  mutable absl::Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  absl::Status injected_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  int64_t in_progress_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<FakeStream>> streams_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<FakeStream> legacy_;
};

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_CPU_COMM_DRIVER_H_
