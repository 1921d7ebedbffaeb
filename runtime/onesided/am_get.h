// Internal to runtime/onesided: gets over an endpoint without an RMA lane (TCP in UCX 1.13) as the
// agent's own active messages, so that a peer reads only inside the regions it was given. (UCX's
// emulated get sends an address and no key: any address of the target process was readable.)
//
// Wire form, fields of 8 bytes little-endian (PackU64s):
//   request, kGetRequestAmId, no data, sent with UCP_AM_SEND_FLAG_REPLY:
//     region token, target address, length, request id
//   reply, kGetReplyAmId, eager, at most kAmPutChunkBytes of data each:
//     request id, offset of the data within the request, refusal (GetRefusal; kNone with data)
// The target checks [address, +length) against the registered host region with that token
// (CheckRegionRange, as for puts) and sends the bytes straight from the region in chunks, or one
// reply carrying the refusal and no data. So a peer can make the target send only bytes of regions
// it was given, at most the region's length per request, and the target allocates nothing per
// request beyond UCX's send requests. The getter writes a reply only inside the request it answers.
//
// Thread safety: PendingGets is thread-safe; ServeGetRequest runs in the target's AM handler.
#ifndef EMBER_RUNTIME_ONESIDED_AM_GET_H_
#define EMBER_RUNTIME_ONESIDED_AM_GET_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime/onesided/ucx_connection.h"
#include "runtime/onesided/work.h"

namespace ember::onesided::internal {

inline constexpr unsigned kGetRequestAmId = 19;
inline constexpr unsigned kGetReplyAmId = 20;

// Why a target refused a get (the reply's third field).
enum class GetRefusal : uint64_t { kNone = 0, kNoSuchToken = 1, kOutside = 2, kMalformed = 3 };

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
  // A reply (the AM handler's arguments; `rndv`: UCP_AM_RECV_ATTR_FLAG_RNDV, which is refused).
  void OnReply(const void* header, size_t header_length, const void* data, size_t length, bool rndv);
  // Ends every get waiting on `conn` (every get when null) with `status`.
  void FailAll(const ConnectionImpl* conn, const absl::Status& status);

 private:
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

// Serves a peer's get request (the AM handler's arguments) from `regions`, whose lock the caller
// holds: replies on the request's reply endpoint with the bytes, or with the refusal. Returns null
// when it sent the bytes, else why it refused (for the log and the count); the requested range in
// `address` and `length` (0 when malformed). `in_flight` as above.
const char* ServeGetRequest(const std::map<uint64_t, LocalRegion>& regions, const void* header,
                            size_t header_length, const ucp_am_recv_param_t* param, std::atomic<int>* in_flight,
                            uint64_t* address, uint64_t* length);

}  // namespace ember::onesided::internal

#endif  // EMBER_RUNTIME_ONESIDED_AM_GET_H_
