#include "runtime/onesided/am_transfer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "runtime/base/little_endian.h"
#include "runtime/onesided/agent.h"
#include "runtime/onesided/descriptor.h"
#include "runtime/onesided/parallel_copy.h"

namespace ember::onesided::internal {
namespace {

// A message the agent sends (put chunk, get request or reply): UCX 1.13 reads the header until the
// send completes, so it lives here until then.
struct Sent {
  std::string header;
  std::atomic<int>* in_flight;
  std::shared_ptr<WorkState> state = nullptr;  // puts: the part this message ends
  ConnectionImpl* conn = nullptr;              // puts: failed on a peer failure
};

// A put message ended with `st`.
void Ended(WorkState* state, ConnectionImpl* conn, ucs_status_t st) {
  if (st != UCS_OK && PeerFailure(st)) conn->Fail(st);
  state->PartDone(st == UCS_OK ? absl::OkStatus() : FromUcs(st, state->what()));
}

void OnSent(void* request, ucs_status_t st, void* user_data) {
  auto* sent = static_cast<Sent*>(user_data);
  sent->in_flight->fetch_sub(1, std::memory_order_acq_rel);
  if (sent->state != nullptr) Ended(sent->state.get(), sent->conn, st);
  delete sent;
  ucp_request_free(request);
}

// Sends `sent`'s header and `length` bytes at `data` (registered as `memh`, or null) as message
// `id` on `ep`, eager: the receiver gets the data in its handler. Returns the status when the send
// ended at once (`sent` freed), UCS_INPROGRESS when `callback` will end it.
ucs_status_t Send(ucp_ep_h ep, unsigned id, Sent* sent, const void* data, uint64_t length, uint32_t flags,
                  ucp_send_nbx_callback_t callback, ucp_mem_h memh = nullptr) {
  ucp_request_param_t rp = {};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  if (memh != nullptr) rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
  rp.cb.send = callback;
  rp.user_data = sent;
  rp.memh = memh;
  rp.flags = UCP_AM_SEND_FLAG_EAGER | flags;
  sent->in_flight->fetch_add(1, std::memory_order_acq_rel);
  ucs_status_ptr_t req = ucp_am_send_nbx(ep, id, sent->header.data(), sent->header.size(), data, length, &rp);
  if (UCS_PTR_IS_PTR(req)) return UCS_INPROGRESS;
  sent->in_flight->fetch_sub(1, std::memory_order_acq_rel);
  delete sent;
  return UCS_PTR_STATUS(req);
}

GetRefusal ToRefusal(RegionCheck check) {
  switch (check) {
    case RegionCheck::kOk:
      return GetRefusal::kNone;
    case RegionCheck::kOutside:
      return GetRefusal::kOutside;
    case RegionCheck::kNoSuchToken:
      break;
  }
  return GetRefusal::kNoSuchToken;
}

}  // namespace

std::string PackU64s(std::initializer_list<uint64_t> fields) {
  std::string h;
  for (uint64_t v : fields) {
    base::AppendU32LE(static_cast<uint32_t>(v), &h);
    base::AppendU32LE(static_cast<uint32_t>(v >> 32), &h);
  }
  return h;
}

bool UnpackU64s(const void* header, size_t length, std::initializer_list<uint64_t*> fields) {
  if (length != 8 * fields.size()) return false;
  const char* h = static_cast<const char*>(header);
  for (uint64_t* f : fields) {
    *f = uint64_t{base::LoadU32LE(h)} | uint64_t{base::LoadU32LE(h + 4)} << 32;
    h += 8;
  }
  return true;
}

std::string AmPutHeader(uint64_t token, uint64_t address) { return PackU64s({token, address}); }

bool ParseAmPutHeader(const void* header, size_t length, uint64_t* token, uint64_t* address) {
  return UnpackU64s(header, length, {token, address});
}

RegionCheck CheckRegionRange(const std::map<uint64_t, LocalRegion>& regions, uint64_t token, uint64_t address,
                             uint64_t length) {
  for (const auto& [id, reg] : regions) {
    if (reg.token != token || reg.kind != MemoryKind::kHost) continue;
    const uint64_t start = reinterpret_cast<uint64_t>(reg.base);
    const bool inside = address >= start && InBounds(address - start, length, reg.bytes);
    return inside ? RegionCheck::kOk : RegionCheck::kOutside;
  }
  return RegionCheck::kNoSuchToken;
}

const char* RegionCheckReason(RegionCheck check) {
  switch (check) {
    case RegionCheck::kOk:
      return nullptr;
    case RegionCheck::kOutside:
      return "the range lies outside the region its token names";
    case RegionCheck::kNoSuchToken:
      break;
  }
  return "no registered host region has its token (deregistered since, or a wrong token)";
}

const char* WriteIntoRegion(const std::map<uint64_t, LocalRegion>& regions, uint64_t token, uint64_t address,
                            const void* data, uint64_t length) {
  const RegionCheck check = CheckRegionRange(regions, token, address, length);
  if (check == RegionCheck::kOk && length > 0) StreamingCopy(reinterpret_cast<void*>(address), data, length);
  return RegionCheckReason(check);
}

void PostAmPut(ConnectionImpl* conn, const std::shared_ptr<WorkState>& state, const char* local, ucp_mem_h memh,
               uint64_t token, uint64_t address, uint64_t length, std::atomic<int>* in_flight) {
  for (uint64_t off = 0; off < length; off += kAmPutChunkBytes) {
    // Eager: one message, handled at the target in order before a later Notify.
    auto* sent = new Sent{AmPutHeader(token, address + off), in_flight, state, conn};
    const uint64_t n = std::min(kAmPutChunkBytes, length - off);
    const ucs_status_t st = Send(conn->ep, kPutAmId, sent, local + off, n, 0, &OnSent, memh);
    if (st != UCS_INPROGRESS) Ended(state.get(), conn, st);
  }
}

struct PendingGets::Request : Sent {
  PendingGets* self;
  uint64_t id;
};

void PendingGets::Post(ConnectionImpl* conn, std::shared_ptr<WorkState> state, char* local, uint64_t token,
                       uint64_t address, uint64_t length) {
  in_flight_->fetch_add(1, std::memory_order_acq_rel);  // until the get ends (Finished)
  uint64_t id;
  {
    absl::MutexLock l(&mu_);
    id = ++next_id_;
    gets_[id] = Get{conn, std::move(state), local, address, length, 0};
  }
  auto* r = new Request{{PackU64s({token, address, length, id}), in_flight_, nullptr, nullptr}, this, id};
  const ucs_status_t st = Send(conn->ep, kGetRequestAmId, r, nullptr, 0, UCP_AM_SEND_FLAG_REPLY, &OnRequestSent);
  if (st == UCS_OK || st == UCS_INPROGRESS) return;
  if (PeerFailure(st)) conn->Fail(st);
  End(id, FromUcs(st, absl::StrCat("sending the request of a get of ", length, " bytes from ", conn->peer())));
}

void PendingGets::OnRequestSent(void* request, ucs_status_t st, void* user_data) {
  auto* r = static_cast<Request*>(user_data);
  PendingGets* self = r->self;
  const uint64_t id = r->id;
  OnSent(request, st, r);
  if (st == UCS_OK) return;
  ConnectionImpl* conn = nullptr;
  {
    absl::MutexLock l(&self->mu_);
    auto it = self->gets_.find(id);
    if (it != self->gets_.end()) conn = it->second.conn;
  }
  if (conn == nullptr) return;
  if (PeerFailure(st)) conn->Fail(st);  // may end this get already (FailAll)
  self->End(id, FromUcs(st, absl::StrCat("sending a get request to ", conn->peer())));
}

ucs_status_t PendingGets::OnReply(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
  static_cast<PendingGets*>(arg)->Reply(header, header_length, data, length,
                                        param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
  return UCS_OK;
}

void PendingGets::Reply(const void* header, size_t header_length, const void* data, size_t length, bool rndv) {
  uint64_t id = 0, offset = 0, refusal = 0;
  if (!UnpackU64s(header, header_length, {&id, &offset, &refusal})) return;  // not ours to answer
  absl::Status status;
  bool done = false;
  Get g;
  {
    absl::MutexLock l(&mu_);
    auto it = gets_.find(id);
    if (it == gets_.end()) return;  // ended already (its connection failed)
    Get& get = it->second;
    const std::string what = absl::StrCat("get of ", get.length, " bytes at 0x", absl::Hex(get.address), " from ",
                                          get.conn->peer());
    if (refusal != static_cast<uint64_t>(GetRefusal::kNone)) {
      const auto r = static_cast<GetRefusal>(refusal);
      const std::string why = absl::StrCat(what, ": refused by ", get.conn->peer(), ": ");
      if (r == GetRefusal::kNoSuchToken) {
        status = absl::NotFoundError(absl::StrCat(why, RegionCheckReason(RegionCheck::kNoSuchToken),
                                                  "; import a current descriptor of the region"));
      } else if (r == GetRefusal::kOutside) {
        status = absl::PermissionDeniedError(absl::StrCat(why, RegionCheckReason(RegionCheck::kOutside)));
      } else if (r == GetRefusal::kQueueFull) {
        status = absl::ResourceExhaustedError(absl::StrCat(
            why, "its queue of gets waiting for reply bytes from this peer is full (", offset,
            " requests, AgentOptions.max_queued_gets, behind AgentOptions.max_get_reply_bytes_in_flight); "
            "wait for earlier gets before posting more"));
      } else {
        status = absl::FailedPreconditionError(absl::StrCat(
            why, "it could not read the request (an agent of another version?)"));
      }
    } else if (rndv || !InBounds(offset, length, get.length) || length > get.length - get.received) {
      status = absl::InternalError(absl::StrCat(what, ": a reply of ", length, " bytes at offset ", offset,
                                                rndv ? " came by rendezvous" : " lies outside the request",
                                                " (an agent of another version?); nothing more is written"));
    } else {
      // Under mu_: FailAll cannot end it meanwhile. Streamed: the region is usually not in cache.
      if (length > 0) StreamingCopy(get.local + offset, data, length);
      get.received += length;
      done = get.received == get.length;
    }
    if (!status.ok() || done) {
      g = std::move(get);
      gets_.erase(it);
    }
  }
  if (!status.ok() || done) Finished(g, std::move(status));
}

void PendingGets::FailAll(const ConnectionImpl* conn, const absl::Status& status) {
  std::vector<Get> ended;
  {
    absl::MutexLock l(&mu_);
    for (auto it = gets_.begin(); it != gets_.end();) {
      if (conn != nullptr && it->second.conn != conn) {
        ++it;
        continue;
      }
      ended.push_back(std::move(it->second));
      it = gets_.erase(it);
    }
  }
  for (Get& g : ended) {
    Finished(g, absl::Status(status.code(), absl::StrCat("get of ", g.length, " bytes at 0x", absl::Hex(g.address),
                                                         " from ", g.conn->peer(), " (", g.received,
                                                         " received): ", status.message())));
  }
}

void PendingGets::End(uint64_t id, absl::Status status) {
  Get g;
  {
    absl::MutexLock l(&mu_);
    auto it = gets_.find(id);
    if (it == gets_.end()) return;
    g = std::move(it->second);
    gets_.erase(it);
  }
  Finished(g, std::move(status));
}

void PendingGets::Finished(Get& g, absl::Status status) {
  in_flight_->fetch_sub(1, std::memory_order_acq_rel);
  g.state->PartDone(std::move(status));
}

namespace {

// Serves a peer's put message into `regions` (lock held). Returns null when written, else why not;
// the target address in `address`.
const char* ServePutAm(const std::map<uint64_t, LocalRegion>& regions, const void* header, size_t header_length,
                       const void* data, size_t length, const ucp_am_recv_param_t* param, uint64_t* address) {
  uint64_t token = 0;
  *address = 0;
  const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  if (rndv || !ParseAmPutHeader(header, header_length, &token, address)) {
    return "sent by rendezvous or with a malformed header (an agent of another version?)";
  }
  return WriteIntoRegion(regions, token, *address, data, length);
}

// Answers get request `id` on `ep` with `refusal` and no data; `detail` in the offset field.
void SendRefusal(ucp_ep_h ep, uint64_t id, GetRefusal refusal, uint64_t detail, std::atomic<int>* in_flight) {
  auto* sent = new Sent{PackU64s({id, detail, static_cast<uint64_t>(refusal)}), in_flight};
  Send(ep, kGetReplyAmId, sent, nullptr, 0, 0, &OnSent);
}

}  // namespace

ucs_status_t AmServer::OnPut(void* arg, const void* header, size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* param) {
  auto* self = static_cast<AmServer*>(arg);
  uint64_t address = 0;
  const char* refused;
  {
    absl::ReaderMutexLock l(self->mu_);
    refused = ServePutAm(*self->regions_, header, header_length, data, length, param, &address);
  }
  if (refused != nullptr) self->Refused(self->refused_puts_, "put", length, address, refused);
  return UCS_OK;
}

struct AmServer::ReplyChunk : Sent {
  AmServer* self;
  ucp_ep_h ep;
  uint64_t bytes;
};

ucs_status_t AmServer::OnGetRequest(void* arg, const void* header, size_t header_length, void*, size_t,
                                    const ucp_am_recv_param_t* param) {
  auto* self = static_cast<AmServer*>(arg);
  uint64_t token = 0, address = 0, length = 0, id = 0;
  const bool parsed = UnpackU64s(header, header_length, {&token, &address, &length, &id});
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    self->Refused(self->refused_gets_, "get", length, address,
                  "sent without a reply endpoint (an agent of another version?); not answered");
    return UCS_OK;
  }
  ucp_ep_h ep = param->reply_ep;
  if (!parsed) {
    SendRefusal(ep, id, GetRefusal::kMalformed, 0, self->in_flight_);
    self->Refused(self->refused_gets_, "get", length, address, "a malformed request (an agent of another version?)");
    return UCS_OK;
  }
  RegionCheck check;
  {
    absl::ReaderMutexLock l(self->mu_);
    check = CheckRegionRange(*self->regions_, token, address, length);
  }
  if (check != RegionCheck::kOk) {  // checked again when served
    SendRefusal(ep, id, ToRefusal(check), 0, self->in_flight_);
    self->Refused(self->refused_gets_, "get", length, address, RegionCheckReason(check));
    return UCS_OK;
  }
  bool full;
  {
    absl::MutexLock l(&self->queue_mu_);
    Peer& peer = self->peers_[ep];
    full = peer.waiting.size() >= self->max_queued_;
    if (!full) peer.waiting.push_back(Waiting{token, address, length, id, 0});
  }
  if (!full) {
    self->Serve(ep);
    return UCS_OK;
  }
  SendRefusal(ep, id, GetRefusal::kQueueFull, self->max_queued_, self->in_flight_);
  self->queue_full_gets_.fetch_add(1);
  self->Refused(self->refused_gets_, "get", length, address,
                "that peer's queue of gets waiting for reply bytes is full (AgentOptions.max_queued_gets)");
  return UCS_OK;
}

void AmServer::Serve(ucp_ep_h ep) {
  struct Post {  // a reply to send: a chunk of data, or a refusal (`why`)
    uint64_t id, address, offset, length;
    GetRefusal refusal;
    const char* why;
  };
  std::vector<Post> posts;
  for (bool again = true; again;) {
    again = false;
    posts.clear();
    // Held shared until the chunks are posted, so Deregister waits (as for puts).
    absl::ReaderMutexLock regions_lock(mu_);
    {
      absl::MutexLock l(&queue_mu_);
      if (hold_) return;  // HoldReplies: served when released
      auto it = peers_.find(ep);
      if (it == peers_.end()) return;
      Peer& peer = it->second;
      while (!peer.waiting.empty()) {
        Waiting& w = peer.waiting.front();
        const RegionCheck check = CheckRegionRange(*regions_, w.token, w.address, w.length);
        if (check != RegionCheck::kOk) {  // deregistered while it waited
          posts.push_back(Post{w.id, w.address, 0, w.length, ToRefusal(check), RegionCheckReason(check)});
          peer.waiting.pop_front();
          continue;
        }
        while (w.sent < w.length) {
          const uint64_t n = std::min(kAmPutChunkBytes, w.length - w.sent);
          if (peer.reply_bytes + n > max_reply_bytes_) break;
          posts.push_back(Post{w.id, w.address, w.sent, n, GetRefusal::kNone, nullptr});
          peer.reply_bytes += n;
          w.sent += n;
        }
        if (w.sent < w.length) break;  // the rest as replies complete
        peer.waiting.pop_front();
      }
      uint64_t peak = peak_reply_bytes_.load();
      while (peer.reply_bytes > peak && !peak_reply_bytes_.compare_exchange_weak(peak, peer.reply_bytes)) {
      }
      if (peer.waiting.empty() && peer.reply_bytes == 0) peers_.erase(it);
    }
    uint64_t ended_at_once = 0;
    bool failed = false;
    for (const Post& p : posts) {
      if (p.refusal != GetRefusal::kNone) {
        SendRefusal(ep, p.id, p.refusal, 0, in_flight_);
        Refused(refused_gets_, "get", p.length, p.address, p.why);
        continue;
      }
      // The bytes go straight from the region (UCX reads them while sending). A send that fails
      // ends the connection too, which the getter sees (UNAVAILABLE).
      auto* chunk = new ReplyChunk{{PackU64s({p.id, p.offset, 0}), in_flight_}, this, ep, p.length};
      const ucs_status_t st = Send(ep, kGetReplyAmId, chunk, reinterpret_cast<const char*>(p.address) + p.offset,
                                   p.length, 0, &OnReplySent);
      if (st == UCS_INPROGRESS) continue;
      ended_at_once += p.length;
      failed = failed || st != UCS_OK;
    }
    if (ended_at_once > 0) again = Release(ep, ended_at_once, failed ? UCS_ERR_IO_ERROR : UCS_OK);
  }
}

void AmServer::OnReplySent(void* request, ucs_status_t st, void* user_data) {
  auto* chunk = static_cast<ReplyChunk*>(user_data);
  AmServer* self = chunk->self;
  const ucp_ep_h ep = chunk->ep;
  const uint64_t bytes = chunk->bytes;
  OnSent(request, st, chunk);
  if (self->Release(ep, bytes, st)) self->Serve(ep);
}

bool AmServer::Release(ucp_ep_h ep, uint64_t bytes, ucs_status_t st) {
  size_t dropped = 0;
  {
    absl::MutexLock l(&queue_mu_);
    auto it = peers_.find(ep);
    if (it == peers_.end()) return false;
    Peer& peer = it->second;
    peer.reply_bytes -= std::min(bytes, peer.reply_bytes);
    if (st != UCS_OK) {
      dropped = peer.waiting.size();
      peer.waiting.clear();
    }
    if (peer.waiting.empty()) {
      if (peer.reply_bytes == 0) peers_.erase(it);
    }
  }
  if (dropped > 0) {
    spdlog::warn("onesided agent {}: a get reply to a peer failed ({}); dropped its {} waiting get requests",
                 *name_, ucs_status_string(st), dropped);
  }
  return st == UCS_OK;
}

void AmServer::HoldReplies(bool hold) {
  std::vector<ucp_ep_h> eps;
  {
    absl::MutexLock l(&queue_mu_);
    hold_ = hold;
    if (hold) return;
    for (const auto& [ep, peer] : peers_) eps.push_back(ep);
  }
  for (ucp_ep_h ep : eps) Serve(ep);  // (the worker is thread-safe: UCS_THREAD_MODE_MULTI)
}

size_t AmServer::waiting_gets() const {
  absl::MutexLock l(&queue_mu_);
  size_t n = 0;
  for (const auto& [ep, peer] : peers_) n += peer.waiting.size();
  return n;
}

void AmServer::DropQueues() {
  absl::MutexLock l(&queue_mu_);
  peers_.clear();
}

void AmServer::Refused(std::atomic<uint64_t>& counter, const char* op, uint64_t length, uint64_t address,
                       const char* why) {
  const uint64_t n = counter.fetch_add(1) + 1;
  if ((n & (n - 1)) == 0) {
    spdlog::warn("onesided agent {}: refused a peer's {} of {} bytes at {:#x}: {}; {} such refused so far",
                 *name_, op, length, address, why, n);
  }
}

}  // namespace ember::onesided::internal
