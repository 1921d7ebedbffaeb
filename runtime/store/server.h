// StoreServer: the rendezvous store's gRPC service, runnable in-process (a daemon with
// --host-store, tests) or as the ember-store binary.
//
//   ASSIGN_OR_RETURN(auto server, StoreServer::Start({.address = "127.0.0.1:0"}));
//   std::string addr = server->address();   // "127.0.0.1:<bound port>"
//   ...                                      // destructor shuts down (waiters get UNAVAILABLE)
//
// Blocking Get/Wait calls hold no thread: they are parked in the backend and answered from the
// thread that makes the key appear (gRPC callback API). Thread-safe; not copyable.
#ifndef EMBER_RUNTIME_STORE_SERVER_H_
#define EMBER_RUNTIME_STORE_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/base/clock.h"
#include "runtime/store/backend.h"
#include "runtime/store/fast_path.h"

namespace grpc {
class ServerCredentials;
}

namespace ember::store {

struct StoreServerOptions {
  std::string address = "127.0.0.1:0";      // loopback by default; port 0 = pick a free port
  std::string auth_token;                   // if set, every call must carry it (UNAUTHENTICATED)
  std::shared_ptr<grpc::ServerCredentials> credentials;  // null = insecure
  BackendOptions backend;                   // limits, durability (data_dir), default timeouts
  // Makes the backend from `backend` and `clock`; null = NewMemoryBackend (etcd: etcd_backend.h).
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(const BackendOptions&, base::Clock*)>
      make_backend;
  base::Clock* clock = nullptr;             // null = real clock; borrowed, must outlive the server
  // Plain-TCP fast path (fast_path.h) on the same host; off when credentials (TLS) are set.
  bool fast_path = true;
  int fast_path_port = 0;  // 0 = the gRPC port + 1 if free, else any (clients ask Info)
  // Connection limits. 0 = derived from RLIMIT_NOFILE (base::ConnectionShare): gRPC gets 1/8 of
  // the usable descriptors (two per connection), the fast path 1/4; each at most 4096. Per-peer
  // limits default to half of the total. See docs/operations.md "Limits against hostile clients".
  int max_grpc_connections = 0;
  int max_grpc_connections_per_peer = 0;
  FastPathLimits fast_path_limits{.max_connections = 0, .max_connections_per_peer = 0};
  // Answers not yet taken by a gRPC Session or Watch client; above it the call ends with
  // RESOURCE_EXHAUSTED (the client stopped reading).
  int64_t max_unsent_bytes_per_stream = 256 << 20;
};

class StoreServer {
 public:
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(StoreServerOptions options);
  ~StoreServer();

  int port() const;
  int fast_port() const;        // 0 when the fast path is off
  std::string address() const;  // host:port actually bound
  Backend* backend();           // the state behind the service (owned by the server)
  // Stops accepting calls and fails outstanding waiters with UNAVAILABLE. Idempotent.
  void Shutdown();

  class Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_SERVER_H_
