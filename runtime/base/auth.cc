#include "runtime/base/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/files.h"
#include "runtime/base/grpc_server.h"
#include "runtime/base/status_macros.h"
#include "spdlog/spdlog.h"

namespace ember::base {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return base::ErrnoToStatus(errno, absl::StrCat("cannot read ", what, " ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, "token file"));
  std::string token(absl::StripAsciiWhitespace(text));
  if (token.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, " holds no token of at least 16 characters"));
  }
  return token;
}

std::string GenerateToken() {
  std::string raw(32, '\0');
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  size_t got = 0;
  while (fd >= 0 && got < raw.size()) {
    ssize_t n = ::read(fd, raw.data() + got, raw.size() - got);
    if (n <= 0) break;
    got += n;
  }
  if (fd >= 0) ::close(fd);
  return absl::BytesToHexString(raw);
}

absl::Status WriteTokenFile(const std::string& path, const std::string& token) {
  return WriteFileAtomic(path, token + "\n", 0600);
}

grpc::Status CheckToken(grpc::ServerContext* ctx, const std::string& expected,
                        const char* method) {
  if (expected.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  const char* why = "no token";
  if (it != md.end()) {
    std::string got(it->second.data(), it->second.size());
    if (ConstantTimeEquals(got, "Bearer " + expected)) return grpc::Status::OK;
    why = "wrong token";
  }
  spdlog::warn("rejected {} from {}: {} (UNAUTHENTICATED; nothing changed)", method, ctx->peer(),
               why);
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrCat(why, ": this daemon requires --auth-token-file's token"));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "serving TLS needs both --tls-cert and --tls-key (a CA alone only verifies peers)");
  }
  grpc::SslServerCredentialsOptions opts(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.private_key, ReadFile(tls.key_file, "TLS key"));
  ASSIGN_OR_RETURN(pair.cert_chain, ReadFile(tls.cert_file, "TLS certificate"));
  opts.pem_key_cert_pairs.push_back(pair);
  if (tls.mutual()) {
    ASSIGN_OR_RETURN(opts.pem_root_certs, ReadFile(tls.ca_file, "TLS CA"));
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  if (!tls.ca_file.empty()) {
    ASSIGN_OR_RETURN(opts.pem_root_certs, ReadFile(tls.ca_file, "TLS CA"));
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate needs its key and the key its certificate (--tls-cert with "
        "--tls-key)");
  }
  if (!tls.cert_file.empty()) {
    ASSIGN_OR_RETURN(opts.pem_cert_chain, ReadFile(tls.cert_file, "TLS certificate"));
    ASSIGN_OR_RETURN(opts.pem_private_key, ReadFile(tls.key_file, "TLS key"));
  }
  return grpc::SslCredentials(opts);
}

}  // namespace ember::base
