// PageAuth's sessions (issue 31): a cookie is refused after logout, after its expiry and after
// the token rotates; a forged or altered cookie is refused; the bearer token still works.
#include "runtime/daemon/page_auth.h"

#include <atomic>
#include <string>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace ember::daemon {
namespace {

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

TEST_CASE("a session cookie reads until logout, and a copy of it is refused afterwards") {
  PageAuth auth(kToken, /*open_read=*/false);
  CHECK(auth.Login("wrong token").empty());
  const std::string cookie = auth.Login(kToken);
  REQUIRE_FALSE(cookie.empty());
  CHECK(cookie.find(kToken) == std::string::npos);  // the token is never in it
  CHECK(auth.MayRead(cookie, ""));
  const std::string other = auth.Login(kToken);
  CHECK(other != cookie);  // each login is its own session
  auth.Logout(cookie);
  CHECK_FALSE(auth.MayRead(cookie, ""));  // the old scheme: a fixed HMAC, valid for ever
  CHECK(auth.MayRead(other, ""));         // other sessions go on
  CHECK(auth.MayRead("", absl::StrCat("Bearer ", kToken)));
  CHECK_FALSE(auth.MayRead("", "Bearer nope"));
}

TEST_CASE("an expired session cookie is refused") {
  std::atomic<int64_t> now_s{1'700'000'000};
  PageAuth auth(kToken, false, absl::Hours(1), [&] { return absl::FromUnixSeconds(now_s); });
  const std::string cookie = auth.Login(kToken);
  REQUIRE_FALSE(cookie.empty());
  now_s += 3599;
  CHECK(auth.MayRead(cookie, ""));
  now_s += 2;
  CHECK_FALSE(auth.MayRead(cookie, ""));
}

TEST_CASE("a forged, altered or extended cookie is refused; token rotation ends every session") {
  PageAuth auth(kToken, false);
  const std::string cookie = auth.Login(kToken);
  REQUIRE_FALSE(cookie.empty());
  // The old scheme's cookie (HMAC of a fixed message) means nothing now.
  CHECK_FALSE(auth.MayRead(PageAuth::HmacSha256Hex(kToken, "ember job page session v1"), ""));
  // A later expiry with the same MAC.
  const size_t dot1 = cookie.find('.'), dot2 = cookie.rfind('.');
  const int64_t expiry = std::stoll(cookie.substr(dot1 + 1, dot2 - dot1 - 1));
  const std::string extended = absl::StrCat(cookie.substr(0, dot1), ".", expiry + 86400,
                                            cookie.substr(dot2));
  CHECK_FALSE(auth.MayRead(extended, ""));
  std::string flipped = cookie;
  flipped.back() = flipped.back() == '0' ? '1' : '0';
  CHECK_FALSE(auth.MayRead(flipped, ""));
  CHECK_FALSE(auth.MayRead("garbage", ""));

  auth.RotateToken("fedcba9876543210fedcba9876543210");
  CHECK_FALSE(auth.MayRead(cookie, ""));
  CHECK(auth.Login(kToken).empty());
  CHECK_FALSE(auth.Login("fedcba9876543210fedcba9876543210").empty());
}

TEST_CASE("auth off or open_read: everything reads") {
  CHECK(PageAuth("", false).MayRead("", ""));
  CHECK(PageAuth(kToken, true).MayRead("", ""));
  CHECK(PageAuth("", false).auth_off());
}

}  // namespace
}  // namespace ember::daemon
