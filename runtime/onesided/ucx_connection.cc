#include "runtime/onesided/ucx_connection.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

#include <cstring>

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
  Remote r{d.base, d.length, nullptr, nullptr, nullptr};
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
    if (in_flight.load(std::memory_order_acquire) > 0 || now - last_activity < kSpinAfterActivity) continue;
    kicked = false;
    if (efd < 0) {
      kicked = progressor.Park(absl::Milliseconds(5));
      continue;
    }
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
    pollfd pfd{efd, POLLIN, 0};
    poll(&pfd, 1, kIdlePollMs);
  }
}

}  // namespace ember::onesided::internal
