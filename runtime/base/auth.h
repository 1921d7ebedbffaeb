// Authentication and transport security shared by emberd, ember-store, the worker and ember::Client.
//
// Tokens are bearer secrets carried as "authorization: Bearer <token>" metadata; comparisons are
// constant-time. TLS (docs/operations.md "TLS"): a server serves its certificate; with a CA file
// it also requires and verifies client certificates (mTLS) unless verify_clients is false. A client
// verifies the server against the CA file (the system roots without one) and presents its own
// certificate when it has one. Files are named by path; key material never travels in the
// environment.
// Thread-safe (pure functions, except CheckToken's logging).
#ifndef EMBER_RUNTIME_BASE_AUTH_H_
#define EMBER_RUNTIME_BASE_AUTH_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace ember::base {

struct TlsOptions {
  std::string cert_file;  // PEM certificate chain (server: its own; client: presented for mTLS)
  std::string key_file;   // PEM private key of cert_file
  std::string ca_file;    // client: trust roots for the server; server: verifies client certs
  // Server with ca_file: require and verify client certificates (mTLS). false = TLS only; the CA
  // then only verifies the servers this process dials (a daemon dialing the store).
  bool verify_clients = true;
  bool enabled() const { return !cert_file.empty() || !ca_file.empty(); }
  bool mutual() const { return enabled() && !ca_file.empty() && verify_clients; }
};

// Token comparison: ConstantTimeEquals in runtime/base/grpc_server.h (one copy for the gRPC gate,
// the store's fast path and CheckToken).

// Reads a token file (whitespace stripped). NotFound/PermissionDenied name the path;
// InvalidArgument when the file is empty or the token is shorter than 16 characters.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// 32 random bytes from /dev/urandom, hex-encoded (64 characters).
std::string GenerateToken();

// Writes `token` to `path` with mode 0600, atomically (base::WriteFileAtomic; replacing it).
absl::Status WriteTokenFile(const std::string& path, const std::string& token);

// OK when `expected` is empty (auth off) or the call carries it. Otherwise UNAUTHENTICATED
// (missing or wrong token), logged with the peer and `method`.
grpc::Status CheckToken(grpc::ServerContext* ctx, const std::string& expected,
                        const char* method);

// Credentials from TlsOptions; insecure ones when !tls.enabled(). INVALID_ARGUMENT when a
// certificate comes without its key (or a server has no certificate); the file errors name the path.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& tls);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_AUTH_H_
