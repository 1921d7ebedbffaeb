#include "runtime/onesided/ucx_connection.h"

#include <poll.h>

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
  while (!stop.load(std::memory_order_acquire)) {
    bool any = false;
    while (!progressor.waiter_spinning() && ucp_worker_progress(worker) != 0) any = true;
    const bool waiter_drives = progressor.waiter_spinning();
    const absl::Time now = absl::Now();
    if (any) last_activity = now;
    if (waiter_drives) {  // woken when the last spinner leaves with requests in flight (LeaveSpin)
      progressor.ParkWhileWaiterSpins(kParkSlice);
      continue;
    }
    // Spin only right after traffic (a loopback reply comes within tens of microseconds). Requests
    // in flight whose peer is slow to answer (descheduled on a busy host, a subscriber writing its
    // snapshot) are waited for on the event fd: spinning then took a core from the training step
    // for as long as the peer took.
    if (now - last_activity < kSpinAfterActivity) continue;
    const bool busy = in_flight.load(std::memory_order_acquire) > 0;
    if (efd < 0) {
      absl::SleepFor(busy ? absl::Microseconds(200) : absl::Milliseconds(5));
      continue;
    }
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
    pollfd pfd{efd, POLLIN, 0};
    if (poll(&pfd, 1, busy ? 1 : kIdlePollMs) > 0) last_activity = absl::Now();  // a peer or a poster
  }
}

}  // namespace ember::onesided::internal
