// The store client's retry rules (see client_retry.h).
#include "runtime/store/client_retry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/store/idempotent.h"

namespace ember::store::client_internal {

using v1::Request;

bool Idempotent(const Request& r) { return IdempotentRequest(r); }

bool BlocksOnServer(const Request& r) {
  return r.has_wait() || (r.has_get() && r.get().wait()) ||
         (r.has_multi_get() && r.multi_get().wait());
}

std::string Describe(const Request& r) {
  switch (r.op_case()) {
    case Request::kSet: return absl::StrCat("Set('", r.set().key(), "')");
    case Request::kGet: return absl::StrCat("Get('", r.get().key(), "')");
    case Request::kAdd: return absl::StrCat("Add('", r.add().key(), "')");
    case Request::kCompareSet: return absl::StrCat("CompareSet('", r.compare_set().key(), "')");
    case Request::kWait: return absl::StrCat("Wait([", absl::StrJoin(r.wait().keys(), ", "), "])");
    case Request::kMultiGet: return absl::StrCat("MultiGet(", r.multi_get().keys_size(), " keys)");
    case Request::kAppend: return absl::StrCat("Append('", r.append().key(), "')");
    case Request::kCheck:
      return absl::StrCat("Check([", absl::StrJoin(r.check().keys(), ", "), "])");
    case Request::kLeaseRefresh:
      return absl::StrCat("RefreshLease(", r.lease_refresh().lease_id(), ")");
    default: return "store call";
  }
}

bool IsPermanent(absl::StatusCode code) {
  return code == absl::StatusCode::kUnauthenticated ||
         code == absl::StatusCode::kPermissionDenied ||
         code == absl::StatusCode::kUnimplemented ||
         code == absl::StatusCode::kFailedPrecondition;  // TLS mismatch
}

absl::Duration Backoff(const ClientOptions& options, int failures, std::mt19937* rng) {
  absl::Duration b = options.initial_backoff;
  for (int i = 1; i < failures && b < options.max_backoff; ++i) b *= 2;
  b = std::min(b, options.max_backoff);
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return b * jitter(*rng);
}

absl::Status ToStatus(const v1::Response& r) {
  if (r.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
}

}  // namespace ember::store::client_internal
