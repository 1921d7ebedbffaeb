// P2PEngine: the cpu backend's asynchronous tagged point-to-point engine. Internal to
// //runtime/comm:comm.
//
// One thread per group progresses every peer's p2p channel: sends go out one message at a time
// per peer (a P2PHeader, then the payload); incoming messages are matched to posted receives by
// (peer, tag) in posting order, and a message nobody has posted for yet is buffered ("unexpected")
// until a matching receive arrives. A size mismatch fails that receive with INVALID_ARGUMENT; a
// channel error fails every op that involves the peer, and the engine stops polling it.
//
// Lifetime: construct, Start(channels) once (after the channels exist; they must outlive Stop),
// Stop() before the channels go away. Post, FailAll and Wake may be called from any thread;
// completion callbacks run on the engine thread (or on the caller's thread when Post completes or
// fails at once), without the engine's lock held.
#ifndef EMBER_RUNTIME_COMM_P2P_ENGINE_H_
#define EMBER_RUNTIME_COMM_P2P_ENGINE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime/comm/channel.h"
#include "runtime/comm/progress_wait.h"
#include "runtime/comm/shm_ring.h"

namespace ember::comm::internal {

constexpr uint32_t kP2PMagic = 0x454d5032;     // "EMP2"

struct P2PHeader {
  uint32_t magic = kP2PMagic;
  int32_t tag = 0;
  uint64_t bytes = 0;
};

class P2PEngine {
 public:
  explicit P2PEngine(int size) : in_(size), sendq_(size), posted_(size), unexpected_(size) {}
  // Starts the engine thread. channels[p] is the p2p channel to rank p (null for this rank);
  // `bell` is this rank's p2p doorbell (null without shared memory), `spin` the thread's budget.
  void Start(std::vector<Channel*> channels, Doorbell* bell, SpinBudget* spin) {
    channels_ = std::move(channels);
    spin_ = spin;
    bell_.store(bell, std::memory_order_release);
    thread_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    Wake();
    if (thread_.joinable()) thread_.join();
  }
  // Queues a send (send = true: `data` is read) or a receive (`data` is written) of exactly `bytes`
  // with `peer`; `data` must stay valid until `done` runs. After FailAll, fails at once.
  void Post(bool send, char* data, size_t bytes, int peer, int tag,
            std::function<void(absl::Status)> done);
  // Fails every pending op with `s`, and every later Post (the group aborted).
  void FailAll(const absl::Status& s);
  // Rings the engine's own shm doorbell (new work, stop) in case the thread sleeps on it.
  void Wake();

 private:
  struct Op {
    char* buf;
    size_t bytes;
    int tag;
    size_t done = 0;
    bool hdr_sent = false;
    P2PHeader hdr;
    std::function<void(absl::Status)> cb;
  };
  struct Unexpected {
    int tag;
    std::vector<char> data;
    bool complete = false;  // still being received while false
  };
  struct Incoming {
    P2PHeader hdr;
    size_t hdr_got = 0;
    size_t remaining = 0;
    char* dst = nullptr;  // posted buffer, unexpected buffer or null (discard)
    std::shared_ptr<Op> op;
    bool active = false;  // reading a payload
    bool to_unexpected = false;
  };
  void Loop();
  bool ProgressLocked(std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyPendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Set by Start before the thread runs; constant afterwards.
  std::vector<Channel*> channels_;
  SpinBudget* spin_ = nullptr;
  std::atomic<Doorbell*> bell_{nullptr};
  std::thread thread_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  std::vector<Incoming> in_ ABSL_GUARDED_BY(mu_);
  std::vector<std::deque<std::shared_ptr<Op>>> sendq_ ABSL_GUARDED_BY(mu_);
  std::vector<std::list<std::shared_ptr<Op>>> posted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::list<Unexpected>> unexpected_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> dead_ = std::vector<bool>(in_.size(), false);  // engine thread only
};

}  // namespace ember::comm::internal

#endif  // EMBER_RUNTIME_COMM_P2P_ENGINE_H_
