// Who may read the job page (job_page.h): the same token as the gRPC API, presented once through
// the login form and then carried by an HttpOnly session cookie, or an "Authorization: Bearer"
// header (scripts). With `open_read` (emberd `job_page_open: true`) every request may read
// without a session.
//
// Sessions: a login makes a session with a random 128-bit id and an expiry (session_ttl, 12 h by
// default). The cookie is "<id>.<expiry unix seconds>.<HMAC-SHA256(token, id|expiry) hex>", never
// the token; it is valid only while all of: its MAC matches the current token (compared in
// constant time), its expiry has not passed, and the server still holds the session (it keeps
// every live one, at most kMaxSessions: the one expiring first gives way). Logout drops the
// session, so a copy of the cookie is refused afterwards; RotateToken (and a daemon restart)
// ends every session.
//
// Thread-safe.
#ifndef EMBER_RUNTIME_DAEMON_PAGE_AUTH_H_
#define EMBER_RUNTIME_DAEMON_PAGE_AUTH_H_

#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ember::daemon {

inline constexpr char kSessionCookie[] = "ember_session";

class PageAuth {
 public:
  static constexpr size_t kMaxSessions = 4096;

  // `token` "" = the daemon runs without auth: everything is readable. `now` is the clock
  // (tests).
  PageAuth(std::string token, bool open_read, absl::Duration session_ttl = absl::Hours(12),
           std::function<absl::Time()> now = [] { return absl::Now(); });

  // May this request read? `cookie` is the kSessionCookie value, `authorization` the header.
  bool MayRead(absl::string_view cookie, absl::string_view authorization) const;
  // A new session's cookie value for a login with `presented` (the token typed into the form);
  // "" when it is not the token.
  std::string Login(absl::string_view presented);
  // Ends the session `cookie` names (nothing if it names none).
  void Logout(absl::string_view cookie);
  // The token changed: every session ends; logins need the new token.
  void RotateToken(std::string token);
  bool auth_off() const;
  bool open_read() const { return open_read_; }
  absl::Duration session_ttl() const { return ttl_; }

  // Lower-case hex of HMAC-SHA256(key, message).
  static std::string HmacSha256Hex(absl::string_view key, absl::string_view message);

 private:
  // The session id of a well-formed cookie with a matching MAC and an expiry not passed; "".
  std::string CheckedId(absl::string_view cookie, int64_t* expiry) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const bool open_read_;
  const absl::Duration ttl_;
  const std::function<absl::Time()> now_;
  mutable absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> sessions_ ABSL_GUARDED_BY(mu_);  // id -> expiry (unix s)
};

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_PAGE_AUTH_H_
