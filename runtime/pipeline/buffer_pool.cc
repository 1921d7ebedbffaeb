#include "runtime/pipeline/buffer_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status_macros.h"
#include "runtime/pipeline/simulator.h"

namespace ember::pipeline {

absl::StatusOr<std::unique_ptr<BufferPool>> BufferPool::Create(const Schedule& s, int rank,
                                                              int64_t floats_per_message,
                                                              BufferPoolOptions opts) {
  if (rank < 0 || rank >= static_cast<int>(s.ranks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer pool: rank ", rank, " is not in a ", s.ranks.size(), "-rank schedule"));
  }
  if (floats_per_message <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer pool: floats_per_message must be positive, got ", floats_per_message));
  }
  ASSIGN_OR_RETURN(SimResult sim, Simulate(s));
  int depth = opts.max_live_recv > 0 ? opts.max_live_recv : sim.peak_recv_buffers[rank];
  std::vector<Action> messages;
  for (const Action& a : s.ranks[rank])
    if (a.is_send() || a.is_recv()) messages.push_back(a);
  return std::unique_ptr<BufferPool>(
      new BufferPool(rank, floats_per_message, opts, depth, std::move(messages)));
}

BufferPool::~BufferPool() = default;

absl::Status BufferPool::BeginStep() {
  if (in_step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "buffer pool (rank ", rank_, "): BeginStep before the previous step's EndStep succeeded"));
  }
  in_step_ = true;
  if (!opts_.preallocate) return absl::OkStatus();
  for (const Action& a : messages_) {
    Buffer& b = buffers_[KeyOf(a)];
    b.data.reset(new float[floats_]());
    b.is_recv = a.is_recv();
    b.action = a;
    live_bytes_ += floats_ * sizeof(float);
  }
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  return absl::OkStatus();
}

absl::StatusOr<float*> BufferPool::Acquire(const Action& a, bool is_recv) {
  const std::string what = ActionToString(a);
  if (!in_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer pool (rank ", rank_, "): ", what, " outside a step (BeginStep)"));
  }
  if (is_recv ? !a.is_recv() : !a.is_send()) {
    return absl::InvalidArgumentError(absl::StrCat("buffer pool (rank ", rank_, "): ", what,
                                                   " is not a ", is_recv ? "receive" : "send"));
  }
  auto it = buffers_.find(KeyOf(a));
  if (opts_.preallocate) {
    if (it == buffers_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buffer pool (rank ", rank_, "): ", what, " is not in this rank's schedule"));
    }
    if (it->second.in_use) {
      return absl::FailedPreconditionError(
          absl::StrCat("buffer pool (rank ", rank_, "): ", what, " already holds its buffer"));
    }
    it->second.in_use = true;
    return it->second.data.get();
  }
  if (it != buffers_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer pool (rank ", rank_, "): ", what, " already holds its buffer"));
  }
  if (is_recv && live_recv_ >= max_live_recv_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "buffer pool (rank ", rank_, "): ", what, " would be receive buffer ", live_recv_ + 1,
        " live at once, over the schedule's depth ", max_live_recv_,
        " (a buffer not released after its compute?)"));
  }
  Buffer& b = buffers_[KeyOf(a)];
  b.data.reset(new float[floats_]);
  b.in_use = true;
  b.is_recv = is_recv;
  b.action = a;
  live_recv_ += is_recv ? 1 : 0;
  live_bytes_ += floats_ * sizeof(float);
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  return b.data.get();
}

absl::StatusOr<float*> BufferPool::AcquireRecv(const Action& recv) { return Acquire(recv, true); }
absl::StatusOr<float*> BufferPool::AcquireSend(const Action& send) { return Acquire(send, false); }

void BufferPool::Free(const Key& k) {
  auto it = buffers_.find(k);
  if (it == buffers_.end()) return;
  if (opts_.preallocate) {  // memory stays until EndStep
    it->second.in_use = false;
    it->second.work = nullptr;
    return;
  }
  live_recv_ -= it->second.is_recv ? 1 : 0;
  live_bytes_ -= floats_ * sizeof(float);
  buffers_.erase(it);
}

absl::Status BufferPool::HoldUntilSent(const Action& send, std::shared_ptr<comm::Work> work) {
  auto it = buffers_.find(KeyOf(send));
  if (it == buffers_.end() || !it->second.in_use || it->second.is_recv || it->second.work) {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer pool (rank ", rank_, "): ", ActionToString(send),
                     " holds no unsent output buffer (AcquireSend first, once)"));
  }
  if (work == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("buffer pool (rank ", rank_, "): ",
                                                   ActionToString(send), " has no Work"));
  }
  it->second.work = std::move(work);
  return Reap(false, absl::ZeroDuration());
}

absl::Status BufferPool::AfterCompute(const Action& compute) {
  Action recv{ActionType::kRecvActivation};
  if (ReceiveReleasedBy(compute, &recv)) {
    auto it = buffers_.find(KeyOf(recv));
    if (it != buffers_.end() && it->second.in_use) Free(it->first);
  }
  return Reap(false, absl::ZeroDuration());
}

absl::Status BufferPool::ReapSends() { return Reap(false, absl::ZeroDuration()); }

absl::Status BufferPool::Reap(bool wait, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status first;
  std::vector<Key> done;
  for (auto& [key, b] : buffers_) {
    if (!b.work) continue;
    if (wait && !b.work->IsCompleted()) {
      b.work->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now())).IgnoreError();
    }
    if (!b.work->IsCompleted()) {
      if (wait && first.ok()) {
        first = absl::DeadlineExceededError(absl::StrCat(
            "buffer pool (rank ", rank_, "): send ", ActionToString(b.action), " (", b.work->op(),
            " seq ", b.work->seq(), ") not completed within ", absl::FormatDuration(timeout),
            "; its buffer stays live"));
      }
      continue;
    }
    absl::Status st = b.work->status();
    if (!st.ok() && first.ok()) {
      first = absl::Status(st.code(), absl::StrCat("send ", ActionToString(b.action), " (rank ",
                                                   rank_, "): ", st.message()));
    }
    done.push_back(key);
  }
  for (const Key& k : done) Free(k);
  return first;
}

absl::Status BufferPool::EndStep(absl::Duration timeout) {
  absl::Status st = Reap(true, timeout);
  std::vector<std::string> leaked;
  bool sends_pending = false;
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    Buffer& b = it->second;
    if (b.work) {  // a send still in flight: the backend may read it, keep it
      sends_pending = true;
      ++it;
      continue;
    }
    if (b.in_use) leaked.push_back(ActionToString(b.action));
    live_recv_ -= b.is_recv && !opts_.preallocate ? 1 : 0;
    live_bytes_ -= floats_ * sizeof(float);
    it = buffers_.erase(it);
  }
  if (!sends_pending) in_step_ = false;
  if (!st.ok()) return st;
  if (!leaked.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "buffer pool (rank ", rank_, "): buffers never released during the step: ",
        absl::StrJoin(leaked, ", "), " (freed now)"));
  }
  return absl::OkStatus();
}

}  // namespace ember::pipeline
