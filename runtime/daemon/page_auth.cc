#include "runtime/daemon/page_auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/auth.h"
#include "runtime/base/grpc_server.h"

namespace ember::daemon {
namespace {
std::string Mac(absl::string_view token, absl::string_view id, int64_t expiry) {
  return PageAuth::HmacSha256Hex(token, absl::StrCat("ember job page session v2|", id, "|", expiry));
}
}  // namespace

std::string PageAuth::HmacSha256Hex(absl::string_view key, absl::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[mac[i] >> 4];
    out += kHex[mac[i] & 15];
  }
  return out;
}

PageAuth::PageAuth(std::string token, bool open_read, absl::Duration session_ttl,
                   std::function<absl::Time()> now)
    : open_read_(open_read), ttl_(session_ttl), now_(std::move(now)), token_(std::move(token)) {}

bool PageAuth::auth_off() const {
  absl::MutexLock l(&mu_);
  return token_.empty();
}

std::string PageAuth::CheckedId(absl::string_view cookie, int64_t* expiry) const {
  std::vector<absl::string_view> parts = absl::StrSplit(cookie, '.');
  if (parts.size() != 3 || parts[0].size() != 32 || !absl::SimpleAtoi(parts[1], expiry)) return "";
  if (!base::ConstantTimeEquals(parts[2], Mac(token_, parts[0], *expiry))) return "";
  if (*expiry <= absl::ToUnixSeconds(now_())) return "";
  return std::string(parts[0]);
}

bool PageAuth::MayRead(absl::string_view cookie, absl::string_view authorization) const {
  absl::MutexLock l(&mu_);
  if (token_.empty() || open_read_) return true;
  if (!cookie.empty()) {
    int64_t expiry = 0;
    const std::string id = CheckedId(cookie, &expiry);
    if (!id.empty()) {
      auto it = sessions_.find(id);
      if (it != sessions_.end() && it->second == expiry) return true;
    }
  }
  constexpr absl::string_view kBearer = "Bearer ";
  return absl::StartsWith(authorization, kBearer) &&
         base::ConstantTimeEquals(authorization.substr(kBearer.size()), token_);
}

std::string PageAuth::Login(absl::string_view presented) {
  absl::MutexLock l(&mu_);
  if (token_.empty() || !base::ConstantTimeEquals(presented, token_)) return "";
  const int64_t now = absl::ToUnixSeconds(now_());
  for (auto it = sessions_.begin(); it != sessions_.end();) {  // the expired ones first
    it = it->second <= now ? sessions_.erase(it) : std::next(it);
  }
  while (sessions_.size() >= kMaxSessions) {  // then the one expiring first
    auto first = sessions_.begin();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->second < first->second) first = it;
    }
    sessions_.erase(first);
  }
  const std::string id = base::GenerateToken().substr(0, 32);
  const int64_t expiry = now + std::max<int64_t>(1, absl::ToInt64Seconds(ttl_));
  sessions_[id] = expiry;
  return absl::StrCat(id, ".", expiry, ".", Mac(token_, id, expiry));
}

void PageAuth::Logout(absl::string_view cookie) {
  absl::MutexLock l(&mu_);
  if (token_.empty()) return;
  int64_t expiry = 0;
  const std::string id = CheckedId(cookie, &expiry);
  if (!id.empty()) sessions_.erase(id);
}

void PageAuth::RotateToken(std::string token) {
  absl::MutexLock l(&mu_);
  token_ = std::move(token);
  sessions_.clear();
}

}  // namespace ember::daemon
