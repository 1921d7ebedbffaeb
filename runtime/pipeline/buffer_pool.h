// BufferPool: the message buffers of one pipeline rank during a step.
//
// Just in time (the default): a receive buffer is allocated when its receive is issued and freed
// after the compute that last reads it (ReceiveReleasedBy in schedule.h); at most `max_live_recv`
// are live at once, the schedule's receive depth on this rank (SimResult::peak_recv_buffers, which
// is counted in program order and so holds for any timing). A sent output is held until the
// send's Work completes; ReapSends/EndStep check completion and surface a failed send's Status.
// Preallocated (`preallocate = true`, the old behaviour kept for comparison): one buffer per
// receive and per send of the rank's schedule, allocated in BeginStep and freed in EndStep.
//
//   ASSIGN_OR_RETURN(auto pool, BufferPool::Create(schedule, rank, floats_per_message, opts));
//   RETURN_IF_ERROR(pool->BeginStep());
//   for (const Action& a : schedule.ranks[rank]) {
//     if (a.is_recv()) { ASSIGN_OR_RETURN(float* buf, pool->AcquireRecv(a)); /* irecv */ }
//     if (a.is_send()) { RETURN_IF_ERROR(pool->HoldUntilSent(a, pg->Send(...))); }
//     if (a.is_compute()) { /* run */ RETURN_IF_ERROR(pool->AfterCompute(a)); }
//   }
//   RETURN_IF_ERROR(pool->EndStep(absl::Minutes(1)));   // no buffer is live afterwards
//
// Thread-compatible: one thread (the rank's executor) uses a pool.
#ifndef EMBER_RUNTIME_PIPELINE_BUFFER_POOL_H_
#define EMBER_RUNTIME_PIPELINE_BUFFER_POOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/work.h"
#include "runtime/pipeline/schedule.h"

namespace ember::pipeline {

struct BufferPoolOptions {
  bool preallocate = false;
  // Just in time: most receive buffers live at once; 0 = the rank's depth from Simulate().
  int max_live_recv = 0;
};

class BufferPool {
 public:
  // `floats_per_message`: every activation and gradient crossing a stage boundary has this many
  // floats (a GPT micro-batch: B*T*d_model). InvalidArgument for a bad rank or a non-positive size;
  // the schedule's own errors as Simulate reports them.
  static absl::StatusOr<std::unique_ptr<BufferPool>> Create(const Schedule& s, int rank,
                                                            int64_t floats_per_message,
                                                            BufferPoolOptions opts = {});
  ~BufferPool();

  // Starts a step. FailedPrecondition if the previous step did not end (EndStep).
  absl::Status BeginStep();

  // The buffer (floats_per_message floats) that receive `recv` (one of this rank's Recv actions)
  // writes into; valid until the compute that reads it last has run (AfterCompute).
  // ResourceExhausted when max_live_recv buffers are already live (a schedule/pool mismatch);
  // FailedPrecondition when that receive already holds one.
  absl::StatusOr<float*> AcquireRecv(const Action& recv);
  // The output buffer that send `send` will send (the producing compute writes into it). Acquire
  // it before the compute; hand it to HoldUntilSent once the send is issued.
  absl::StatusOr<float*> AcquireSend(const Action& send);
  // Keeps the send's buffer until `work` completes, then frees it (ReapSends / EndStep).
  // FailedPrecondition if the buffer was never acquired; the first failed earlier send, if any.
  absl::Status HoldUntilSent(const Action& send, std::shared_ptr<comm::Work> work);
  // Frees the receive buffer `compute` read last (ReceiveReleasedBy), if this rank holds one.
  // Also reaps completed sends; returns the first failed send as "send <action>: <status>".
  absl::Status AfterCompute(const Action& compute);
  // Frees the buffers of completed sends; a failed send's status comes back annotated (its buffer
  // is freed either way).
  absl::Status ReapSends();
  // Waits up to `timeout` for every held send, frees everything (preallocated buffers too).
  // FailedPrecondition naming the receives whose buffers were never released; the first failed
  // send's status; DeadlineExceeded naming a send not done by then.
  absl::Status EndStep(absl::Duration timeout);

  // Counters (this rank).
  int live_buffers() const { return static_cast<int>(buffers_.size()); }
  int64_t live_bytes() const { return live_bytes_; }
  int64_t peak_bytes() const { return peak_bytes_; }  // since Create
  int max_live_recv() const { return max_live_recv_; }

 private:
  using Key = std::tuple<int, int, int>;  // action type, stage, micro-batch
  struct Buffer {
    std::unique_ptr<float[]> data;
    bool in_use = false;                 // preallocated: acquired this step
    bool is_recv = false;
    std::shared_ptr<comm::Work> work;    // a held send
    Action action{ActionType::kForward};
  };
  BufferPool(int rank, int64_t floats, BufferPoolOptions opts, int max_live_recv,
             std::vector<Action> messages)
      : rank_(rank), floats_(floats), opts_(opts), max_live_recv_(max_live_recv),
        messages_(std::move(messages)) {}
  static Key KeyOf(const Action& a) { return {static_cast<int>(a.type), a.stage, a.micro_batch}; }
  absl::StatusOr<float*> Acquire(const Action& a, bool is_recv);
  void Free(const Key& k);
  absl::Status Reap(bool wait, absl::Duration timeout);

  const int rank_;
  const int64_t floats_;
  const BufferPoolOptions opts_;
  const int max_live_recv_;
  const std::vector<Action> messages_;  // this rank's sends and receives
  bool in_step_ = false;
  int live_recv_ = 0;
  int64_t live_bytes_ = 0, peak_bytes_ = 0;
  std::map<Key, Buffer> buffers_;
};

}  // namespace ember::pipeline

#endif  // EMBER_RUNTIME_PIPELINE_BUFFER_POOL_H_
