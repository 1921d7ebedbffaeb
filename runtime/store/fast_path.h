// FastPathServer: the store's plain-TCP transport, for clients on hosts that can reach it.
//
// Same requests and responses as the gRPC Session stream (RequestBatch / ResponseBatch protobufs),
// framed as u32le length + payload over a TCP socket, served by one epoll thread. It exists because
// a gRPC stream message costs tens of microseconds of CPU per side on a small host, which kept the
// store behind TCPStore for one-op-at-a-time callers. The first frame of a connection must carry the
// auth token (when the server has one); the server answers it with an empty ResponseBatch, or with
// one UNAUTHENTICATED response and closes. Plaintext only: with TLS configured the server disables
// it (Info reports fast_port 0) and clients use gRPC.
//
// Limits (FastPathLimits): an unauthenticated connection may send one small frame (the handshake)
// and is closed if it does not complete it in time; connections are bounded per peer and in total,
// and when full the oldest unauthenticated connection is closed to admit a new one; buffered input
// (all connections) and unsent output (per connection) are bounded. docs/operations.md lists them.
//
// Thread-safety: Start/Stop from one thread; everything else is internal.
#ifndef EMBER_RUNTIME_STORE_FAST_PATH_H_
#define EMBER_RUNTIME_STORE_FAST_PATH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/store/backend.h"
#include "runtime/store/fast_path_protocol.h"

namespace ember::store {

struct FastPathLimits {
  int max_connections = 4096;            // total; StoreServer lowers it to fit RLIMIT_NOFILE
  int max_connections_per_peer = 1024;   // per client IP (TCP) or uid (Unix socket)
  uint32_t max_handshake_frame_bytes = 4096;  // the only frame an unauthenticated peer may send
  absl::Duration handshake_timeout = absl::Seconds(10);
  int64_t max_buffered_input_bytes = int64_t{1} << 30;  // all connections' partial frames
  int64_t max_unsent_output_bytes = 256 << 20;  // per connection: a peer that stops reading
};

class FastPathServer {
 public:
  // Listens on host:port (port 0 = any). `backend` is borrowed and must outlive the server.
  static absl::StatusOr<std::unique_ptr<FastPathServer>> Start(const std::string& host, int port,
                                                               Backend* backend,
                                                               std::string auth_token,
                                                               FastPathLimits limits = {});
  ~FastPathServer();
  int port() const;
  void Stop();  // closes every connection (their waiters are cancelled). Idempotent.

  class Impl;

 private:
  explicit FastPathServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_FAST_PATH_H_
