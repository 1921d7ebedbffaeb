#include "runtime/onesided/ucx_connection.h"

#include "absl/strings/str_cat.h"
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

absl::StatusOr<RemoteRegion> ConnectionImpl::ImportRegion(absl::string_view descriptor) {
  ASSIGN_OR_RETURN(RegionDescriptor d, UnpackDescriptor(descriptor));
  if (d.owner != peer_) {
    return absl::InvalidArgumentError(absl::StrCat("region descriptor belongs to agent '", d.owner,
                                                   "', not to this connection's peer '", peer_, "'"));
  }
  Remote r{d.base, d.length, nullptr, nullptr};
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
  }
  RemoteRegion out{handle_counter->fetch_add(1) + 1};
  absl::MutexLock l(&mu_);
  remotes_[out.handle] = r;
  return out;
}

}  // namespace ember::onesided::internal
