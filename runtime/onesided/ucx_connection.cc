#include "runtime/onesided/ucx_connection.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>

#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/onesided/descriptor.h"

namespace ember::onesided::internal {

bool PeerFailure(ucs_status_t st) {
  return st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_ENDPOINT_TIMEOUT ||
         st == UCS_ERR_UNREACHABLE || st == UCS_ERR_REJECTED || st == UCS_ERR_IO_ERROR;
}

absl::Status FromUcs(ucs_status_t st, absl::string_view what) {
  if (st == UCS_OK) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": UCX ", ucs_status_string(st));
  if (PeerFailure(st)) return absl::UnavailableError(absl::StrCat(msg, " (the peer failed or is unreachable)"));
  if (st == UCS_ERR_CANCELED) return absl::CancelledError(absl::StrCat(msg, " (agent shut down)"));
  return absl::InternalError(msg);
}

std::string ResolveNetDevices(const std::string& option) {
  if (getenv("UCX_NET_DEVICES") != nullptr || option.empty() || option == "all") return "";
  if (option != "auto") return option;
  const char* world = getenv("EMBER_WORLD_SIZE");
  const char* local = getenv("EMBER_LOCAL_WORLD_SIZE");
  if (world != nullptr && local != nullptr && std::string(world) == local) return "lo";
  const char* store = getenv("EMBER_STORE_ADDR");
  if (store == nullptr) return "";
  // The device holding the address this host uses towards the store's host.
  std::string host(store);
  if (const size_t colon = host.rfind(':'); colon != std::string::npos) host.resize(colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (host.empty() || getaddrinfo(host.c_str(), "9", &hints, &res) != 0) return "";
  std::string device;
  const int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local_addr{};
  socklen_t len = sizeof(local_addr);
  const bool routed = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                      getsockname(fd, reinterpret_cast<sockaddr*>(&local_addr), &len) == 0;
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  ifaddrs* ifs = nullptr;
  if (!routed || getifaddrs(&ifs) != 0) return "";
  for (ifaddrs* i = ifs; i != nullptr && device.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != local_addr.ss_family) continue;
    if (local_addr.ss_family == AF_INET) {
      if (reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
          reinterpret_cast<sockaddr_in*>(&local_addr)->sin_addr.s_addr) {
        device = i->ifa_name;
      }
    } else if (local_addr.ss_family == AF_INET6 &&
               memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                      &reinterpret_cast<sockaddr_in6*>(&local_addr)->sin6_addr, 16) == 0) {
      device = i->ifa_name;
    }
  }
  freeifaddrs(ifs);
  return device;
}

bool ApplyUcxDefaults(ucp_config_t* config, const std::string& net_devices) {
  // Transport keys go without their TCP_ prefix, and only where TCP may be used (UCX warns of
  // unused keys); RX >= TX or TCP fails.
  if (getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");
  if (!net_devices.empty() && getenv("UCX_NET_DEVICES") == nullptr) {
    ucp_config_modify(config, "NET_DEVICES", net_devices.c_str());
  }
  const std::string tls = getenv("UCX_TLS") == nullptr ? "all" : getenv("UCX_TLS");
  const bool tcp_named = tls.find("tcp") != std::string::npos;
  const bool tcp_may = tls[0] == '^' ? !tcp_named : tcp_named || tls == "all";
  // This side never sends UCX's TCP puts (they bypass the region tokens); see agent.h, Exposure.
  if (tcp_may && getenv("UCX_TCP_PUT_ENABLE") == nullptr) ucp_config_modify(config, "PUT_ENABLE", "n");
  if (tcp_may && getenv("UCX_TCP_TX_SEG_SIZE") == nullptr && getenv("UCX_TCP_RX_SEG_SIZE") == nullptr) {
    const std::string bytes = absl::StrCat(kTcpSegmentBytes);
    for (const char* key : {"TX_SEG_SIZE", "RX_SEG_SIZE"}) ucp_config_modify(config, key, bytes.c_str());
    return true;
  }
  return false;
}

absl::Status ConnectionImpl::Open(ucp_worker_h worker, const std::string& address, bool detect_peer_failure,
                                  ucp_err_handler_cb_t on_error) {
  ucp_ep_params_t p = {};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(address.data());
  p.err_mode = detect_peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  p.err_handler.cb = on_error;
  p.err_handler.arg = this;
  ucs_status_t st = ucp_ep_create(worker, &p, &ep);
  if (st == UCS_ERR_UNREACHABLE && detect_peer_failure) {
    // UCX 1.13's shared-memory message transports (posix, sysv) cannot report a dead peer, so with
    // UCX_TLS=sm no endpoint with peer-failure handling exists: connect without it. Failures then
    // surface as transfer errors (CMA) or as Wait/WaitNotification timeouts.
    p.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
    p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(worker, &p, &ep);
  }
  if (st != UCS_OK) return FromUcs(st, absl::StrCat("creating the endpoint to ", peer_));
  map_direct = p.err_mode == UCP_ERR_HANDLING_MODE_NONE;
  return absl::OkStatus();
}

ucs_status_t ConnectionImpl::SendNow(unsigned id, absl::string_view header, absl::string_view data,
                                     Progressor& progressor) {
  ucp_request_param_t rp = {};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
  rp.flags = UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t req = ucp_am_send_nbx(ep, id, header.data(), header.size(), data.data(), data.size(), &rp);
  if (!UCS_PTR_IS_PTR(req)) return UCS_PTR_STATUS(req);
  // Not expected (FORCE_IMM_CMPL); the request reads the caller's buffers until it completes.
  while (ucp_request_check_status(req) == UCS_INPROGRESS) progressor.ProgressUntil([] { return false; }, 1);
  const ucs_status_t st = ucp_request_check_status(req);
  ucp_request_free(req);
  return st;
}

void ConnectionImpl::SendAfterFlush(std::function<void(ucs_status_t)> send) {
  behind_flush_.fetch_add(1, std::memory_order_acq_rel);
  bool start;
  {
    absl::MutexLock l(&flush_mu_);
    flush_waiters_.push_back(std::move(send));
    start = flush_covers_ == 0;
    if (start) flush_covers_ = flush_waiters_.size();
  }
  if (start) StartFlush();
}

void ConnectionImpl::StartFlush() {
  ucp_request_param_t rp = {};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.send = &ConnectionImpl::OnFlushed;
  rp.user_data = this;
  in_flight->fetch_add(1, std::memory_order_acq_rel);
  ucs_status_ptr_t req = ucp_ep_flush_nbx(ep, &rp);
  if (UCS_PTR_IS_PTR(req)) {
    wake();
    return;
  }
  in_flight->fetch_sub(1, std::memory_order_acq_rel);
  Flushed(UCS_PTR_STATUS(req));
}

void ConnectionImpl::OnFlushed(void* request, ucs_status_t st, void* user_data) {
  auto* self = static_cast<ConnectionImpl*>(user_data);
  self->in_flight->fetch_sub(1, std::memory_order_acq_rel);
  ucp_request_free(request);
  self->Flushed(st);
}

void ConnectionImpl::Flushed(ucs_status_t st) {
  std::vector<std::function<void(ucs_status_t)>> ready;
  bool again;
  {
    absl::MutexLock l(&flush_mu_);
    // After an error the endpoint is not flushed again: every waiter gets the error.
    const size_t n = st == UCS_OK ? flush_covers_ : flush_waiters_.size();
    for (size_t i = 0; i < n; ++i) {
      ready.push_back(std::move(flush_waiters_.front()));
      flush_waiters_.pop_front();
    }
    flush_covers_ = flush_waiters_.size();
    again = flush_covers_ > 0;
  }
  // Only here are waiters sent, one flush at a time, so they go out in queue order.
  for (auto& send : ready) send(st);
  behind_flush_.fetch_sub(static_cast<int>(ready.size()), std::memory_order_acq_rel);
  if (again) StartFlush();  // for those queued meanwhile (after puts this flush may not cover)
}

absl::StatusOr<ucp_mem_h> AllocateUcxMemory(ucp_context_h ctx, uint64_t bytes, void** address) {
  ucp_mem_map_params_t mp = {};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(ctx, &mp, &memh);
  if (st != UCS_OK) return FromUcs(st, absl::StrCat("allocating ", bytes, " bytes through UCX"));
  ucp_mem_attr_t attr = {};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  st = ucp_mem_query(memh, &attr);
  if (st != UCS_OK) {
    ucp_mem_unmap(ctx, memh);
    return FromUcs(st, "ucp_mem_query");
  }
  *address = attr.address;
  return memh;
}

void CloseEndpoints(ucp_worker_h worker, const std::deque<std::unique_ptr<ConnectionImpl>>& conns) {
  std::vector<ucs_status_ptr_t> closing;
  for (const auto& c : conns) {
    c->DestroyRkeys();
    if (c->ep == nullptr) continue;
    ucp_request_param_t cp = {};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;  // ends requests in flight with an error
    ucs_status_ptr_t r = ucp_ep_close_nbx(c->ep, &cp);
    if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (ucs_status_ptr_t r : closing) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && absl::Now() < deadline) {
      ucp_worker_progress(worker);
    }
    ucp_request_free(r);
  }
}

bool EndpointHasRmaLane(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return true;
  ucp_ep_print_info(ep, f);
  fclose(f);
  // One line per lane that carries RMA: "#                  put[1]: 0..<short>..".
  const bool rma = text == nullptr || strstr(text, " put[") != nullptr;
  free(text);
  return rma;
}

absl::StatusOr<PeerAddress> ExchangeAddresses(store::Client& store, ucp_worker_h worker,
                                              const std::string& prefix, const std::string& self,
                                              int self_rank, absl::string_view peer, int n,
                                              absl::Duration timeout) {
  ucp_worker_attr_t wa = {};
  wa.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  ucs_status_t st = ucp_worker_query(worker, &wa);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_query");
  std::string mine = absl::StrCat(self_rank, ":",
      absl::Base64Escape(absl::string_view(reinterpret_cast<const char*>(wa.address), wa.address_length)));
  ucp_worker_release_address(worker, wa.address);
  const std::string base = absl::StrCat(prefix, "addr/");
  RETURN_IF_ERROR(store.Set(absl::StrCat(base, self, "/", peer, "/", n), mine));
  const std::string their_key = absl::StrCat(base, peer, "/", self, "/", n);
  auto theirs = store.Get(their_key, {.wait = true, .timeout = timeout});
  if (!theirs.ok()) {
    return absl::Status(theirs.status().code(),
                        absl::StrCat("Connect #", n, " to '", peer, "': the peer did not publish ",
                                     their_key, ": ", theirs.status().message(),
                                     " (is it running and calling Connect('", self, "')?)"));
  }
  const size_t colon = theirs->find(':');
  PeerAddress out;
  if (colon == std::string::npos || !absl::SimpleAtoi(theirs->substr(0, colon), &out.rank) ||
      !absl::Base64Unescape(theirs->substr(colon + 1), &out.address)) {
    return absl::InvalidArgumentError(absl::StrCat("Connect: malformed address under ", their_key));
  }
  return out;
}

absl::StatusOr<RemoteRegion> ConnectionImpl::ImportRegion(absl::string_view descriptor) {
  ASSIGN_OR_RETURN(RegionDescriptor d, UnpackDescriptor(descriptor));
  if (d.owner != peer_) {
    return absl::InvalidArgumentError(absl::StrCat("region descriptor belongs to agent '", d.owner,
                                                   "', not to this connection's peer '", peer_, "'"));
  }
  Remote r{d.base, d.length, nullptr, nullptr, nullptr, d.token};
  if (d.length > 0 && cuda_ipc::IsExported(d.rkey)) {
    auto m = cuda_ipc::Mapping::Open(d.rkey, d.length);
    if (!m.ok()) {
      return absl::Status(m.status().code(), absl::StrCat("importing ", peer_, "'s GPU region of ",
                                                          d.length, " bytes: ", m.status().message()));
    }
    r.base = reinterpret_cast<uint64_t>((*m)->ptr());
    r.cuda = std::move(*m);
  } else if (d.length > 0) {
    ucs_status_t st = ucp_ep_rkey_unpack(ep, d.rkey.data(), &r.rkey);
    if (st != UCS_OK) return FromUcs(st, absl::StrCat("unpacking a remote key from ", peer_));
    void* mapped = nullptr;
    if (map_direct && ucp_rkey_ptr(r.rkey, d.base, &mapped) == UCS_OK) r.mapped = static_cast<char*>(mapped);
  }
  RemoteRegion out{handle_counter->fetch_add(1) + 1};
  absl::MutexLock l(&mu_);
  remotes_[out.handle] = r;
  return out;
}

void RunProgressLoop(ucp_worker_h worker, int efd, WorkerProgressor& progressor,
                     const std::atomic<bool>& stop, const std::atomic<int>& in_flight) {
  constexpr absl::Duration kSpinAfterActivity = absl::Microseconds(200);
  constexpr int kIdlePollMs = 50;
  absl::Time last_activity = absl::Now();
  bool kicked = false;  // requests were left with nobody waiting: drive them until idle
  while (!stop.load(std::memory_order_acquire)) {
    // A waiter drives the worker now, or did so within kWaiterGrace (a request/reply loop between
    // two waits): stay parked and off the event fd, where every arriving message would wake us.
    if (progressor.waiter_spinning() || (!kicked && progressor.waiter_active(kWaiterGrace))) {
      kicked = progressor.Park(kParkSlice) || kicked;
      continue;
    }
    bool any = false;
    while (!progressor.waiter_spinning() && ucp_worker_progress(worker) != 0) any = true;
    const absl::Time now = absl::Now();
    if (any) last_activity = now;
    if (progressor.waiter_spinning()) continue;
    // Spin only right after traffic (a loopback reply comes within tens of microseconds). Requests
    // in flight whose peer is slow to answer (descheduled on a busy host, a subscriber writing its
    // snapshot) are waited for on the event fd: spinning then took a core from the training step
    // for as long as the peer took.
    if (now - last_activity < kSpinAfterActivity) continue;
    const bool busy = in_flight.load(std::memory_order_acquire) > 0;
    if (!busy) kicked = false;
    if (efd < 0) {
      kicked = progressor.Park(busy ? absl::Microseconds(200) : absl::Milliseconds(5)) || kicked;
      continue;
    }
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
    pollfd pfd{efd, POLLIN, 0};
    if (poll(&pfd, 1, busy ? 1 : kIdlePollMs) > 0) last_activity = absl::Now();  // a peer or a poster
  }
}

}  // namespace ember::onesided::internal
