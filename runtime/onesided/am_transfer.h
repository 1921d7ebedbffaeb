// Internal to runtime/onesided: puts and gets over an endpoint without an RMA lane (TCP in UCX
// 1.13) as the agent's own active messages, so that a peer writes and reads only inside the
// regions it was given. (UCX's emulated put and get send an address and no key: any address of the
// target process was writable and readable.)
//
// Wire form, headers of 8-byte little-endian fields (PackU64s):
//   put, kPutAmId, eager, at most kAmPutChunkBytes of data each: region token, target address.
//     The target writes the data only inside the host region with that token (WriteIntoRegion),
//     else drops it (the sender's Work completes OK: nothing answers an eager message).
//   request, kGetRequestAmId, no data, sent with UCP_AM_SEND_FLAG_REPLY:
//     region token, target address, length, request id
//   reply, kGetReplyAmId, eager, at most kAmPutChunkBytes of data each:
//     request id, offset of the data within the request, refusal (GetRefusal; kNone with data)
// The target checks [address, +length) against the registered host region with that token
// (CheckRegionRange, as for puts) and sends the bytes straight from the region in chunks, or one
// reply carrying the refusal and no data. So a peer can make the target send only bytes of regions
// it was given, at most the region's length per request, and the target allocates nothing per
// request beyond UCX's send requests. The getter writes a reply only inside the request it answers.
// Per reply endpoint (peer), at most `max_reply_bytes` of reply data are posted and not yet
// completed; requests beyond it wait in that peer's FIFO (at most `max_queued` entries of 40
// bytes, re-checked against the regions when served, dropped when a reply to the peer fails or
// the agent goes) and one arriving when it is full is refused (kQueueFull, the limit in the
// reply's offset field).
//
// Thread safety: PendingGets is thread-safe; the Serve functions run in the target's AM handlers.
#ifndef EMBER_RUNTIME_ONESIDED_AM_TRANSFER_H_
#define EMBER_RUNTIME_ONESIDED_AM_TRANSFER_H_

#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime/onesided/ucx_connection.h"
#include "runtime/onesided/work.h"

namespace ember::onesided::internal {

inline constexpr unsigned kPutAmId = 18;
inline constexpr unsigned kGetRequestAmId = 19;
inline constexpr unsigned kGetReplyAmId = 20;

// The header of a put sent as an active message: the target region's token, then the target
// address. (Before the token it was the address alone, 8 bytes; such a header is refused.)
std::string AmPutHeader(uint64_t token, uint64_t address);
bool ParseAmPutHeader(const void* header, size_t length, uint64_t* token, uint64_t* address);
// Active-message headers are fields of 8 bytes, little-endian: PackU64s appends them in order;
// UnpackU64s fills `fields` from a header of exactly 8 * fields.size() bytes (false otherwise).
std::string PackU64s(std::initializer_list<uint64_t> fields);
bool UnpackU64s(const void* header, size_t length, std::initializer_list<uint64_t*> fields);
// Where a peer's active-message put or get may touch this agent's memory: kOk when the host region
// of `regions` whose token is `token` holds [address, +length) whole.
enum class RegionCheck { kOk, kNoSuchToken, kOutside };
RegionCheck CheckRegionRange(const std::map<uint64_t, LocalRegion>& regions, uint64_t token, uint64_t address,
                             uint64_t length);
const char* RegionCheckReason(RegionCheck check);  // null for kOk; else why, for messages
// Copies `length` bytes from `data` to `address` if CheckRegionRange allows it, and returns null;
// otherwise writes nothing and returns why (for the log). The caller holds the lock guarding
// `regions`.
const char* WriteIntoRegion(const std::map<uint64_t, LocalRegion>& regions, uint64_t token, uint64_t address,
                            const void* data, uint64_t length);

// The number of put messages for `length` bytes.
inline int AmPutChunks(uint64_t length) {
  return static_cast<int>((length + kAmPutChunkBytes - 1) / kAmPutChunkBytes);
}
// Sends `length` bytes at `local` (registered as `memh`) to `address` of `conn`'s peer's region
// with `token`, as AmPutChunks(length) messages sent from `local`; each ends one part of `state`
// (a peer failure also fails `conn`). `in_flight` as for PendingGets.
void PostAmPut(ConnectionImpl* conn, const std::shared_ptr<WorkState>& state, const char* local, ucp_mem_h memh,
               uint64_t token, uint64_t address, uint64_t length, std::atomic<int>* in_flight);

// Why a target refused a get (the reply's third field).
enum class GetRefusal : uint64_t { kNone = 0, kNoSuchToken = 1, kOutside = 2, kMalformed = 3, kQueueFull = 4 };

// The gets this agent has in flight, by request id: where each reply's bytes go and which part of
// which Work the last one completes. Outlives every UCX request it posts (the agent owns it and
// closes its endpoints first).
class PendingGets {
 public:
  // `in_flight`: the agent's count of requests in flight (its progress loop's), raised while a get
  // waits for its replies.
  explicit PendingGets(std::atomic<int>* in_flight) : in_flight_(in_flight) {}

  // Asks `conn`'s peer for `length` > 0 bytes at `address` of its region with `token`, to be
  // written to `local`; one part of `state` ends when all have arrived (OK), when the peer refused
  // (NOT_FOUND / PERMISSION_DENIED, nothing written), or when the request or connection failed.
  void Post(ConnectionImpl* conn, std::shared_ptr<WorkState> state, char* local, uint64_t token,
            uint64_t address, uint64_t length);
  // The handler of kGetReplyAmId replies; `arg` is the PendingGets. A reply by rendezvous is refused.
  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param);
  // Ends every get waiting on `conn` (every get when null) with `status`.
  void FailAll(const ConnectionImpl* conn, const absl::Status& status);

 private:
  void Reply(const void* header, size_t header_length, const void* data, size_t length, bool rndv);
  struct Get {
    ConnectionImpl* conn;
    std::shared_ptr<WorkState> state;
    char* local;
    uint64_t address, length, received;
  };
  struct Request;  // one request message in flight
  static void OnRequestSent(void* request, ucs_status_t st, void* user_data);
  // Removes `id` and ends its part with `status` (nothing when it ended already).
  void End(uint64_t id, absl::Status status);
  void Finished(Get& g, absl::Status status);  // after removal, outside mu_

  std::atomic<int>* const in_flight_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Get> gets_ ABSL_GUARDED_BY(mu_);
};

// The target's side: serves peers' put messages and get requests from the agent's registered
// regions, read under `mu` (held shared while writing into a region or posting the replies, so
// Deregister waits), and counts and logs (rate-limited) what it refuses. The handlers take it as
// their `arg`. Everything it points to outlives it. Thread-safe.
class AmServer {
 public:
  // `max_reply_bytes` (raised to kAmPutChunkBytes) and `max_queued` (raised to 1): the limits of
  // get replies per peer (header comment).
  AmServer(const std::string* agent_name, absl::Mutex* mu, const std::map<uint64_t, LocalRegion>* regions,
           std::atomic<int>* in_flight, uint64_t max_reply_bytes, int max_queued)
      : name_(agent_name), mu_(mu), regions_(regions), in_flight_(in_flight),
        max_reply_bytes_(std::max(max_reply_bytes, kAmPutChunkBytes)),
        max_queued_(static_cast<size_t>(std::max(max_queued, 1))) {}
  // kPutAmId: written into the region whose token the header carries if it holds the range, else
  // dropped and counted (the sender checked the range against its descriptor, so this is a region
  // deregistered since, a forged token or a malformed message).
  static ucs_status_t OnPut(void* arg, const void* header, size_t header_length, void* data, size_t length,
                            const ucp_am_recv_param_t* param);
  // kGetRequestAmId: queued and served in order with the bytes as the peer's limit allows, or
  // answered with the refusal (counted).
  static ucs_status_t OnGetRequest(void* arg, const void* header, size_t header_length, void* data,
                                   size_t length, const ucp_am_recv_param_t* param);
  // Drops every waiting request (the agent is going; its worker is no longer progressed).
  void DropQueues();
  uint64_t refused_puts() const { return refused_puts_.load(); }
  uint64_t refused_gets() const { return refused_gets_.load(); }
  uint64_t queue_full_gets() const { return queue_full_gets_.load(); }  // also in refused_gets()
  // The most reply bytes ever in flight to one peer at once (at most max_reply_bytes).
  uint64_t peak_reply_bytes() const { return peak_reply_bytes_.load(); }
  // Testing: while held, admitted get requests wait in their queues and nothing is sent for them;
  // releasing serves every queue, each request's region checked again first (Agent's
  // HoldGetRepliesForTest). waiting_gets(): requests waiting now, over all peers.
  void HoldReplies(bool hold);
  size_t waiting_gets() const;

 private:
  struct Waiting {  // a get request not yet sent whole
    uint64_t token, address, length, id, sent;
  };
  struct Peer {
    uint64_t reply_bytes = 0;  // posted, not completed
    std::deque<Waiting> waiting;
  };
  struct ReplyChunk;
  static void OnReplySent(void* request, ucs_status_t st, void* user_data);
  // Reply chunks of `bytes` to `ep` ended with `st`: frees their bytes and drops `ep`'s queue on an
  // error. Returns whether to Serve `ep` again (st is UCS_OK).
  bool Release(ucp_ep_h ep, uint64_t bytes, ucs_status_t st);
  // Sends `ep`'s waiting requests in order while its reply bytes stay within the limit.
  void Serve(ucp_ep_h ep);
  void Refused(std::atomic<uint64_t>& counter, const char* op, uint64_t length, uint64_t address,
               const char* why);

  const std::string* const name_;
  absl::Mutex* const mu_;
  const std::map<uint64_t, LocalRegion>* const regions_;  // guarded by *mu_
  std::atomic<int>* const in_flight_;
  const uint64_t max_reply_bytes_;
  const size_t max_queued_;
  std::atomic<uint64_t> refused_puts_{0}, refused_gets_{0}, queue_full_gets_{0}, peak_reply_bytes_{0};
  mutable absl::Mutex queue_mu_;  // after *mu_; not held while sending
  bool hold_ ABSL_GUARDED_BY(queue_mu_) = false;  // HoldReplies
  std::map<ucp_ep_h, Peer> peers_ ABSL_GUARDED_BY(queue_mu_);
};

}  // namespace ember::onesided::internal

#endif  // EMBER_RUNTIME_ONESIDED_AM_TRANSFER_H_
