#include "runtime/daemon/page_auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/match.h"
#include "runtime/base/grpc_server.h"

namespace ember::daemon {

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

PageAuth::PageAuth(std::string token, bool open_read)
    : token_(std::move(token)), open_read_(open_read),
      session_(token_.empty() ? "" : HmacSha256Hex(token_, "ember job page session v1")) {}

bool PageAuth::MayRead(absl::string_view cookie, absl::string_view authorization) const {
  if (token_.empty() || open_read_) return true;
  if (!cookie.empty() && base::ConstantTimeEquals(cookie, session_)) return true;
  constexpr absl::string_view kBearer = "Bearer ";
  return absl::StartsWith(authorization, kBearer) &&
         base::ConstantTimeEquals(authorization.substr(kBearer.size()), token_);
}

std::string PageAuth::Login(absl::string_view presented) const {
  if (token_.empty()) return "";
  return base::ConstantTimeEquals(presented, token_) ? session_ : "";
}

}  // namespace ember::daemon
