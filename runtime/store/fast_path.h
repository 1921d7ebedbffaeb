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
// Thread-safety: Start/Stop from one thread; everything else is internal.
#ifndef EMBER_RUNTIME_STORE_FAST_PATH_H_
#define EMBER_RUNTIME_STORE_FAST_PATH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/store/backend.h"
#include "runtime/store/fast_path_protocol.h"

namespace ember::store {



class FastPathServer {
 public:
  // Listens on host:port (port 0 = any). `backend` is borrowed and must outlive the server.
  static absl::StatusOr<std::unique_ptr<FastPathServer>> Start(const std::string& host, int port,
                                                               Backend* backend,
                                                               std::string auth_token);
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
