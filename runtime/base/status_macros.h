// Status propagation macros (Debian's Abseil 20220623 has no status_macros.h).
//
//   RETURN_IF_ERROR(DoThing());                    // returns the Status if not OK
//   ASSIGN_OR_RETURN(auto v, ComputeThing());      // v = *StatusOr, or return its Status
//
// Both evaluate their argument exactly once. Thread-compatible (pure macros).
#ifndef EMBER_RUNTIME_BASE_STATUS_MACROS_H_
#define EMBER_RUNTIME_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define EMBER_STATUS_CONCAT_INNER_(a, b) a##b
#define EMBER_STATUS_CONCAT_(a, b) EMBER_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                          \
  do {                                                                 \
    ::absl::Status ember_status_ = ::ember::base::ToStatus((expr));    \
    if (!ember_status_.ok()) return ember_status_;                     \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, rexpr) \
  EMBER_ASSIGN_OR_RETURN_IMPL_(EMBER_STATUS_CONCAT_(ember_statusor_, __LINE__), lhs, rexpr)

#define EMBER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

namespace ember::base {
inline const absl::Status& ToStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& ToStatus(const absl::StatusOr<T>& s) { return s.status(); }

// Returns `s` with `context + ": "` prepended to its message (code unchanged); OK stays OK.
absl::Status Annotate(const absl::Status& s, absl::string_view context);

// Converts errno into a Status at a system-call boundary: ENOENT -> NotFound, EACCES/EPERM ->
// PermissionDenied, EEXIST -> AlreadyExists, ENOSPC -> ResourceExhausted, EAGAIN/EINTR -> Unavailable,
// anything else -> Internal. The message is "<context>: <strerror> (errno N)".
absl::Status ErrnoToStatus(int err, absl::string_view context);
}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_STATUS_MACROS_H_
