#include "runtime/base/status_macros.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ember::base {

absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

absl::Status ErrnoToStatus(int err, absl::string_view context) {
  std::string msg = absl::StrCat(context, ": ", std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case ENOENT: return absl::NotFoundError(msg);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(msg);
    case EEXIST: return absl::AlreadyExistsError(msg);
    case ENOSPC: return absl::ResourceExhaustedError(msg);
    case EAGAIN:
    case EINTR: return absl::UnavailableError(msg);
    default: return absl::InternalError(msg);
  }
}

}  // namespace ember::base
