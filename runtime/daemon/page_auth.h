// Who may read the job page (job_page.h): the same token as the gRPC API, presented once through
// the login form and then carried by an HttpOnly cookie, or an "Authorization: Bearer" header
// (scripts). The cookie holds HMAC-SHA256(token, "ember job page session v1") in hex, never the
// token, and is compared in constant time; changing the token ends every session. With
// `open_read` (emberd `job_page_open: true`) every request may read without a session.
//
// Thread-safe (immutable after construction).
#ifndef EMBER_RUNTIME_DAEMON_PAGE_AUTH_H_
#define EMBER_RUNTIME_DAEMON_PAGE_AUTH_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ember::daemon {

inline constexpr char kSessionCookie[] = "ember_session";

class PageAuth {
 public:
  // `token` "" = the daemon runs without auth: everything is readable.
  PageAuth(std::string token, bool open_read);

  // May this request read? `cookie` is the kSessionCookie value, `authorization` the header.
  bool MayRead(absl::string_view cookie, absl::string_view authorization) const;
  // The cookie value for a login with `presented` (the token typed into the form); "" when it is
  // not the token.
  std::string Login(absl::string_view presented) const;
  bool auth_off() const { return token_.empty(); }
  bool open_read() const { return open_read_; }

  // Lower-case hex of HMAC-SHA256(key, message).
  static std::string HmacSha256Hex(absl::string_view key, absl::string_view message);

 private:
  const std::string token_;
  const bool open_read_;
  const std::string session_;  // the cookie value a login sets
};

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_PAGE_AUTH_H_
