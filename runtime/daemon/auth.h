// Authentication and transport security shared by emberd, the store it hosts and ember::Client.
//
// Tokens are bearer secrets carried as "authorization: Bearer <token>" metadata; comparisons are
// constant-time. TLS: a server with a CA file requires and verifies client certificates (mTLS).
// Thread-safe (pure functions, except CheckToken's logging).
#ifndef EMBER_RUNTIME_DAEMON_AUTH_H_
#define EMBER_RUNTIME_DAEMON_AUTH_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace ember::daemon {

struct TlsOptions {
  std::string cert_file;  // PEM certificate chain (server: its own; client: for mTLS)
  std::string key_file;   // PEM private key
  std::string ca_file;    // server: verify client certs against it (mTLS); client: trust roots
  bool enabled() const { return !cert_file.empty() || !ca_file.empty(); }
};

// Reads a token file (whitespace stripped). NotFound/PermissionDenied name the path;
// InvalidArgument when the file is empty or the token is shorter than 16 characters.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// 32 random bytes from /dev/urandom, hex-encoded (64 characters).
std::string GenerateToken();

// Writes `token` to `path` with mode 0600 (replacing it).
absl::Status WriteTokenFile(const std::string& path, const std::string& token);

// OK when `expected` is empty (auth off) or the call carries it. Otherwise UNAUTHENTICATED
// (missing or wrong token), logged with the peer and `method`.
grpc::Status CheckToken(grpc::ServerContext* ctx, const std::string& expected,
                        const char* method);

// Credentials from TlsOptions; insecure ones when !tls.enabled().
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& tls);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_AUTH_H_
