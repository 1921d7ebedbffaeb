// How the cpu backend's progress loops (collective executor, p2p engine) pace themselves and wait.
// Internal to //runtime/comm:comm.
//
// - ShmWaiter: when only shared-memory transfers are pending, spin a bounded (adaptive) number of
//   rounds, then sleep on the rank's own doorbell (peers ring it when they move a ring we wait on).
// - Backoff: when TCP transfers are pending (alone or mixed with shm), spin briefly, then poll().
//
// Thread safety: a SpinBudget and a ShmWaiter belong to one thread; Backoff is a pure function.
#ifndef EMBER_RUNTIME_COMM_PROGRESS_WAIT_H_
#define EMBER_RUNTIME_COMM_PROGRESS_WAIT_H_

#include <immintrin.h>
#include <poll.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/comm/shm_ring.h"

namespace ember::comm::internal {

constexpr size_t kStepBytes = 64 << 10;        // work per channel per progress iteration
// TCP: one send()/recv() per step costs a syscall, so let each step move up to 1 MiB (the kernel
// takes what fits in the 4 MiB socket buffer); recv-reduce is bounded by the channel's stage.
constexpr size_t kTcpStepBytes = 1 << 20;
// A futex wait on the shm doorbell gives up after this long and re-checks abort / peer liveness
// (Abort and Shutdown ring the doorbell, so this is only the fallback for a peer that died).
constexpr long kShmWaitUs = 5000;
constexpr int kMinSpin = 8;

// Most idle rounds to spin (pause) before sleeping on the doorbell. Spinning only pays when every
// local rank has its own core: with more ranks than online CPUs, a spinning waiter steals the core
// of the peer it waits for, so it sleeps after a few rounds. EMBER_COMM_SHM_SPIN (kEnvShmSpin) overrides.
int ShmSpinRounds(int local_ranks);

// Adaptive spin budget, kept across waits by one thread: halves whenever a wait had to sleep (the
// peer was not running: other load on the cores) and grows when a spin succeeds; every 32nd wait
// probes with the full budget so it can recover once the host is quiet again.
struct SpinBudget {
  int max = kMinSpin;
  int cur = kMinSpin;
  uint32_t waits = 0;
};

// Sleep on a doorbell after the spin budget: arm (register as waiter), let the caller re-check
// everything once more, then FUTEX_WAIT. Call Idle() after a round without progress and Busy()
// after one with progress.
class ShmWaiter {
 public:
  ShmWaiter(Doorbell* bell, SpinBudget* budget) : bell_(bell), b_(budget) {}
  ~ShmWaiter() { Busy(); }
  void Busy() {
    if (armed_) {
      DisarmDoorbell(bell_);
      armed_ = false;
    }
    if (idle_ > 0) {
      if (slept_) {
        b_->cur = std::max(kMinSpin, b_->cur / 2);
      } else if (idle_ > kMinSpin) {
        b_->cur = std::min(b_->max, std::max(b_->cur, 2 * idle_));
      }
    }
    idle_ = 0;
    slept_ = false;
  }
  void Idle() {
    if (!armed_) {
      if (idle_ == 0) limit_ = (++b_->waits % 32 == 0) ? b_->max : b_->cur;
      if (!slept_ && ++idle_ <= limit_) {
        _mm_pause();
        return;
      }
      seen_ = ArmDoorbell(bell_);
      armed_ = true;
      return;  // the caller re-checks its conditions before we sleep
    }
    WaitDoorbell(bell_, seen_, kShmWaitUs);
    DisarmDoorbell(bell_);
    armed_ = false;
    slept_ = true;  // the next idle round arms again at once
  }

 private:
  Doorbell* bell_;
  SpinBudget* b_;
  int idle_ = 0;
  int limit_ = 0;
  bool armed_ = false;
  bool slept_ = false;
  uint32_t seen_ = 0;
};

// Waits without burning the core forever: spin, then yield, then poll/sleep. Used when TCP
// channels are pending (alone or mixed with shm ones); `fds` are the TCP channels to poll (empty:
// spin, yield, then sleep longer the longer `idle` grows).
void Backoff(int idle, const std::vector<pollfd>& fds);

}  // namespace ember::comm::internal

#endif  // EMBER_RUNTIME_COMM_PROGRESS_WAIT_H_
