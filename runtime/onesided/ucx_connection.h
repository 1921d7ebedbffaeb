// Internal to runtime/onesided: UCX status mapping, the Connection implementation, the worker
// Progressor and progress loop, and the UCX set-up helpers (defaults, allocation, endpoints, the
// remote regions) used by agent.cc. Not part of the API (agent.h is). Thread-safe
// as stated per class; the free functions are thread-compatible.
#ifndef EMBER_RUNTIME_ONESIDED_UCX_CONNECTION_H_
#define EMBER_RUNTIME_ONESIDED_UCX_CONNECTION_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/onesided/agent.h"
#include "runtime/onesided/cuda_ipc.h"
#include "runtime/store/client.h"
#include "runtime/onesided/work.h"

namespace ember::onesided::internal {

// Whether `st` means the peer is gone or unreachable.
bool PeerFailure(ucs_status_t st);
// OK for UCS_OK; UNAVAILABLE for a peer failure, CANCELLED for a shut-down agent, INTERNAL else.
absl::Status FromUcs(ucs_status_t st, absl::string_view what);

// Sets UCX defaults the user left unset on `config` (agent.h says which and why): the keepalive,
// the TCP segments, UCX_TCP_PUT_ENABLE=n, and UCX_NET_DEVICES=`net_devices` when that is not ""
// (ResolveNetDevices' answer). Returns whether it set the TCP segments (kTcpSegmentBytes), which
// AgentOptions::put_over_am relies on.
bool ApplyUcxDefaults(ucp_config_t* config, const std::string& net_devices = "");

// The UCX_NET_DEVICES value for AgentOptions::net_devices `option` ("" = leave UCX's default),
// from the environment for "auto" (agent.h). "" also when UCX_NET_DEVICES is set (it wins).
std::string ResolveNetDevices(const std::string& option);

// Allocates and maps `bytes` through UCX (UCP_MEM_MAP_ALLOCATE); its address in `*address`.
absl::StatusOr<ucp_mem_h> AllocateUcxMemory(ucp_context_h ctx, uint64_t bytes, void** address);

// A region registered by this agent.
struct LocalRegion {
  void* base = nullptr;
  uint64_t bytes = 0;
  ucp_mem_h memh = nullptr;
  MemoryKind kind = MemoryKind::kHost;
  uint64_t token = 0;  // RegionDescriptor::token, carried by active-message puts into it
};

struct Remote {
  uint64_t base = 0, length = 0;
  ucp_rkey_h rkey = nullptr;
  // The peer's region mapped into this process (ucp_rkey_ptr) on a connection with map_direct;
  // null where UCX cannot map it (CMA, TCP) or the connection does not allow it.
  char* mapped = nullptr;
  std::shared_ptr<cuda_ipc::Mapping> cuda;  // a peer's GPU region (then base is its local address)
  uint64_t token = 0;  // RegionDescriptor::token, sent with active-message puts into the region
};

// One UCX endpoint to a peer agent, its imported remote regions and its health. Owned by the
// agent; thread-safe.
class ConnectionImpl : public Connection {
 public:
  ConnectionImpl(std::string peer, int peer_rank) : peer_(std::move(peer)), peer_rank_(peer_rank) {}
  const std::string& peer() const override { return peer_; }
  int peer_rank() const override { return peer_rank_; }
  absl::StatusOr<RemoteRegion> ImportRegion(absl::string_view descriptor) override;
  // Creates `ep` to the peer worker at `address`, with peer-failure handling (`on_error`) when
  // `detect_peer_failure` and UCX can (not with UCX_TLS=sm); sets map_direct when without.
  absl::Status Open(ucp_worker_h worker, const std::string& address, bool detect_peer_failure,
                    ucp_err_handler_cb_t on_error);
  absl::Status health() const override {
    absl::MutexLock l(&mu_);
    return health_;
  }
  // Marks the connection failed (first error wins) and wakes WaitNotification callers.
  void Fail(ucs_status_t st) {
    {
      absl::MutexLock l(&mu_);
      if (!health_.ok()) return;
      health_ = FromUcs(st, absl::StrCat("connection to ", peer_));
    }
    if (on_failure) on_failure();
  }
  absl::StatusOr<Remote> Lookup(RemoteRegion r) const {
    absl::MutexLock l(&mu_);
    auto it = remotes_.find(r.handle);
    if (it == remotes_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "remote region handle ", r.handle, " was not imported on the connection to ", peer_,
          " (use this connection's ImportRegion)"));
    }
    return it->second;
  }
  uint64_t NextSeq() { return ++seq_; }
  // Notifications that must wait for an endpoint flush (a Notify after puts), and every later one
  // while any waits, so that none passes an earlier one: `send(status)` runs, in queue order, from
  // the completion of a flush posted after it was queued (`status`: the flush's; on an error the
  // rest of the queue gets it too). One flush at a time; `in_flight` counts it, `wake` is called
  // when it is left to the progress thread (both set before the first call).
  void SendAfterFlush(std::function<void(ucs_status_t)> send);
  // Sends active message `id` with `header` and `data` only if UCX completes the send at once
  // (returns its status); UCS_ERR_NO_RESOURCE when it would have had to queue it (nothing sent).
  ucs_status_t SendNow(unsigned id, absl::string_view header, absl::string_view data, Progressor& progressor);
  // Whether a notification waits behind a flush or is being sent from one: a later one must queue.
  bool notifies_behind_flush() const { return behind_flush_.load(std::memory_order_acquire) > 0; }
  void DestroyRkeys() {
    absl::MutexLock l(&mu_);
    for (auto& [h, r] : remotes_)
      if (r.rkey != nullptr) ucp_rkey_destroy(r.rkey);
    remotes_.clear();
  }

  ucp_ep_h ep = nullptr;
  std::atomic<uint64_t>* handle_counter = nullptr;
  // Puts posted since the last Notify's flush: a Notify with none skips the flush (a round trip
  // on TCP) and sends its message at once.
  std::atomic<uint64_t> unflushed_puts{0};
  std::function<void()> on_failure;  // set before the endpoint exists
  std::atomic<int>* in_flight = nullptr;  // the agent's count of requests in flight (SendAfterFlush)
  std::function<void()> wake;             // wakes the agent's progress thread (SendAfterFlush)
  // Set before any import: the endpoint has no peer-failure handling, so UCX itself would move
  // bytes of shared-memory regions with plain loads and stores (its mm transports); the agent may
  // then copy large transfers itself through Remote::mapped (agent.cc).
  bool map_direct = false;
  // Set before any transfer: puts and gets travel as the agent's own active messages (agent.cc,
  // am_get.h), at most this many bytes of data each, because the endpoint has no RMA lane
  // (EndpointHasRmaLane); 0: ucp_put_nbx / ucp_get_nbx.
  uint64_t am_chunk = 0;

 private:
  const std::string peer_;
  const int peer_rank_;
  std::atomic<uint64_t> seq_{0};
  mutable absl::Mutex mu_;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Remote> remotes_ ABSL_GUARDED_BY(mu_);

  void StartFlush();  // for the first flush_covers_ waiters
  static void OnFlushed(void* request, ucs_status_t st, void* user_data);
  void Flushed(ucs_status_t st);
  absl::Mutex flush_mu_;  // not held while sending or flushing
  std::deque<std::function<void(ucs_status_t)>> flush_waiters_ ABSL_GUARDED_BY(flush_mu_);
  size_t flush_covers_ ABSL_GUARDED_BY(flush_mu_) = 0;  // waiters the flush in flight serves; 0: none
  std::atomic<int> behind_flush_{0};  // waiters, until their send was posted
};

// Whether UCX moves puts on `ep` over an RMA lane (shared memory, CMA, RDMA): true when
// ucp_ep_print_info lists a put protocol for some lane. False means UCX would emulate put with its
// own active messages (TCP: no RMA lane in UCX 1.13), where the agent's own active-message put is
// faster (agent.cc). True when the description cannot be read, so the default stays UCX's put.
bool EndpointHasRmaLane(ucp_ep_h ep);

// Force-closes every connection's endpoint (requests in flight end with an error) after
// destroying its remote keys, driving `worker` until they are closed or 5 s passed.
void CloseEndpoints(ucp_worker_h worker, const std::deque<std::unique_ptr<ConnectionImpl>>& conns);

// The peer's side of Connect's address exchange.
struct PeerAddress {
  int rank = -1;
  std::string address;  // the peer worker's UCX address
};
// Publishes `worker`'s address under <prefix>addr/<self>/<peer>/<n> and waits up to `timeout` for
// the peer's under <prefix>addr/<peer>/<self>/<n> (agent.h: the N-th Connect pairs with the N-th).
absl::StatusOr<PeerAddress> ExchangeAddresses(store::Client& store, ucp_worker_h worker,
                                              const std::string& prefix, const std::string& self,
                                              int self_rank, absl::string_view peer, int n,
                                              absl::Duration timeout);

// The worker, for waiters that drive progress themselves (work.h); cleared before it is destroyed.
class WorkerProgressor : public Progressor {
 public:
  explicit WorkerProgressor(ucp_worker_h w) : worker_(w) {}
  bool ProgressUntil(absl::FunctionRef<bool()> done, int max_passes) override {
    absl::ReaderMutexLock l(&mu_);  // once per batch; Clear() waits for it
    if (worker_ == nullptr) return false;
    for (int i = 0; i < max_passes; ++i) {
      ucp_worker_progress(worker_);
      if (done()) return true;
    }
    return false;
  }
  void Clear() {
    absl::MutexLock l(&mu_);
    worker_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  ucp_worker_h worker_ ABSL_GUARDED_BY(mu_);
};

// The agent's progress thread until `stop`: parks (Progressor::Park) while a waiter or poster
// drives the worker itself or did so within kWaiterGrace, unless kicked (requests left in flight
// with nobody waiting), checked before every pass: a poster may hold the worker's lock for a whole
// shared-memory copy, and a waiter in a request/reply loop is back within microseconds, so a pass
// then would only contend with it, and sleeping on the event fd would wake this thread for every
// arriving message. Otherwise it spins on ucp_worker_progress while traffic arrived (or the event
// fd fired) in the last 200 us, and then sleeps on the worker's event fd `efd`: 1 ms at most while
// requests are in flight (`in_flight` > 0; in case a transport raises no event), 50 ms when idle
// (parks 200 us / 5 ms when efd < 0). It does not spin merely because requests are in flight: a
// slow peer costs wake-ups, not a core.
void RunProgressLoop(ucp_worker_h worker, int efd, WorkerProgressor& progressor,
                     const std::atomic<bool>& stop, const std::atomic<int>& in_flight);

}  // namespace ember::onesided::internal

#endif  // EMBER_RUNTIME_ONESIDED_UCX_CONNECTION_H_
