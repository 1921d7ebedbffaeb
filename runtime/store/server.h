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

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/base/clock.h"
#include "runtime/store/backend.h"

namespace grpc {
class ServerCredentials;
}

namespace ember::store {

struct StoreServerOptions {
  std::string address = "127.0.0.1:0";      // loopback by default; port 0 = pick a free port
  std::string auth_token;                   // if set, every call must carry it (UNAUTHENTICATED)
  std::shared_ptr<grpc::ServerCredentials> credentials;  // null = insecure
  BackendOptions backend;                   // limits, durability (data_dir), default timeouts
  base::Clock* clock = nullptr;             // null = real clock; borrowed, must outlive the server
  // Plain-TCP fast path (fast_path.h) on the same host; off when credentials (TLS) are set.
  bool fast_path = true;
  int fast_path_port = 0;  // 0 = the gRPC port + 1 if free, else any (clients ask Info)
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
