// Starting gRPC servers the same way everywhere: bind (port 0 allowed), report the bound port,
// and bound what a peer without credentials can hold.
//
//   ASSIGN_OR_RETURN(auto server, StartGrpcServer({.address = "127.0.0.1:0"}, {&service}));
//   int port = server.port;                    // the port the kernel gave us
//
// Connections are accepted by the helper, not by gRPC (gRPC 1.51 has no connection limit, and its
// listener stops for good after one accept() fails with EMFILE). The helper admits at most
// max_connections in all and max_connections_per_peer per client IP; when full it closes the
// oldest connection that has not made an authenticated call (and is older than a short grace
// period) to admit the new one, otherwise it closes the new one. Admitted connections are handed
// to gRPC with the server's credentials (TLS included). gRPC closes connections that do not
// complete the HTTP/2 (and TLS) handshake within handshake_timeout.
//
// The returned server owns the listening socket; the services are borrowed and must outlive it.
#ifndef EMBER_RUNTIME_BASE_GRPC_SERVER_H_
#define EMBER_RUNTIME_BASE_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace ember::base {

struct GrpcServerOptions {
  std::string address = "127.0.0.1:0";  // host:port; port 0 picks a free port
  std::shared_ptr<grpc::ServerCredentials> credentials;  // null = insecure
  int max_message_bytes = 64 << 20;     // receive and send limit per message
  // 0 = derived from RLIMIT_NOFILE (ConnectionShare(8)), at most 4096.
  int max_connections = 0;
  int max_connections_per_peer = 0;     // 0 = half of max_connections
  // Calls carrying "authorization: Bearer <auth_token>" mark their connection authenticated, which
  // protects it from being closed to make room. Empty = every connection counts as authenticated.
  std::string auth_token;
  absl::Duration handshake_timeout = absl::Seconds(10);
  absl::Duration unauthenticated_grace = absl::Seconds(1);  // not closed to make room before this
  int64_t memory_quota_bytes = int64_t{1} << 30;  // gRPC resource quota (buffers of all calls)
};

class ConnectionGate;  // the accept loop (grpc_server.cc)

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address;  // host:port actually bound
  // Declared after `server`, so destroyed first: stops accepting before the server goes away.
  std::shared_ptr<ConnectionGate> gate;
};

// Builds and starts a server with `services`. FailedPrecondition/Unavailable naming the address
// when the bind fails (address in use, bad host).
absl::StatusOr<StartedServer> StartGrpcServer(const GrpcServerOptions& options,
                                              const std::vector<grpc::Service*>& services);

// Raises the soft RLIMIT_NOFILE to the hard limit (call once at process start) and returns the
// soft limit in force.
int64_t RaiseOpenFileLimit();

// 1/`parts` of the descriptors a process may spend on connections: the soft RLIMIT_NOFILE less a
// headroom (64 + 1/8) for logs, the WAL, gRPC's own descriptors and checkpoints. At least 1.
int ConnectionShare(int parts);

// --- Shared by the accept loops (the gate here, the store's fast path) ---------------------------

// Compares secrets in a time that does not depend on where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Warnings about refused connections, at most one line a second with the count of those not
// logged: a flood must not flood the log. Not thread-safe.
class RefusalLog {
 public:
  explicit RefusalLog(std::string who) : who_(std::move(who)) {}
  void Refused(const std::string& what);

 private:
  const std::string who_;
  absl::Time last_ = absl::InfinitePast();
  int64_t unlogged_ = 0;
};

// A spare descriptor for an accept loop. When accept() fails with EMFILE/ENFILE the pending
// connection keeps the listener readable forever (a busy loop, or gRPC's listener stopping for
// good); Shed() gives up the spare to accept that connection and close it, then takes the spare
// back. Not thread-safe.
class SpareDescriptor {
 public:
  SpareDescriptor();
  ~SpareDescriptor();
  SpareDescriptor(const SpareDescriptor&) = delete;
  SpareDescriptor& operator=(const SpareDescriptor&) = delete;
  void Shed(int listen_fd);

 private:
  int fd_;
};

// Maps between absl::Status and grpc::Status (codes are numerically identical).
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_GRPC_SERVER_H_
