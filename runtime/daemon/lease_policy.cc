#include "runtime/daemon/lease_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ember::daemon {

bool RefusesCredentials(const absl::Status& s) {
  return absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s);
}

std::string LeaseLostReason(const std::string& node, const absl::Status& s, bool answered,
                            absl::Duration since_ack, absl::Duration ttl, absl::Duration margin) {
  if (s.ok()) return "";
  const std::string lost = "node lost: " + node;
  if (answered && absl::IsNotFound(s)) return lost;  // (a failed dial is never an expired lease)
  if (RefusesCredentials(s)) {
    return absl::StrCat(lost, ": store refused the lease refresh: ", s.ToString(),
                        "; check the daemon's store token");
  }
  if (since_ack > ttl + margin) {
    return absl::StrCat(lost, ": no lease refresh acknowledged for ",
                        absl::FormatDuration(absl::Trunc(since_ack, absl::Milliseconds(100))),
                        " (lease_ttl ", absl::FormatDuration(ttl),
                        "): the store has expired the lease");
  }
  return "";
}

absl::Duration RegisterRetryDelay(int failures) {
  absl::Duration d = absl::Milliseconds(500);
  for (int i = 1; i < failures && d < absl::Seconds(5); ++i) d *= 2;
  return std::min(d, absl::Seconds(5));
}

bool LogRegisterFailure(int failures, absl::Duration since_log) {
  return failures <= 3 || since_log >= absl::Seconds(30);
}

}  // namespace ember::daemon
