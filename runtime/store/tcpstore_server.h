// TcpStoreServer: PyTorch c10d TCPStore's wire protocol (as torch 1.13 speaks it: Debian's
// python3-torch) on the store's key space, so unmodified TCPStore clients rendezvous through
// ember-store (docs/store-etcd.md "TCPStore compatibility").
//
// Supported: set, get (blocking), add, check, wait, compare_set, delete_key, num_keys. Not:
// watch_key (the connection is closed, logged) and torch 2.x's validation handshake and
// multi get/set (2.x renumbered the query types; a 2.x client fails on its first query).
// Keys: TCPStore sends "/k" for a user key "k"; the leading '/' is dropped so that Ember clients
// see "k" (and torch sees Ember's "k" as "k"). With a key_prefix P every key is P + "k" and
// num_keys counts the keys under P only: a listener per prefix is a private key space (emberd
// starts one per script-job attempt on jobs/<job>/attempt/<n>/torch/).
// TCPStore has no authentication: whoever reaches the port can read and write every key. It binds
// loopback unless the caller chooses another host.
//
// Thread-safety: one thread per connection (TCPStore clients are few: two per rank); Shutdown()
// (and the destructor) closes the listener and every connection and joins the threads.
#ifndef EMBER_RUNTIME_STORE_TCPSTORE_SERVER_H_
#define EMBER_RUNTIME_STORE_TCPSTORE_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/store/backend.h"

namespace ember::store {

class TcpStoreServer {
 public:
  // Listens on host:port (port 0 = any free port). `backend` is borrowed and must outlive the
  // server (StoreServer::backend()). Every key is stored under `key_prefix`.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, int port,
                                                               Backend* backend,
                                                               std::string key_prefix = "");
  ~TcpStoreServer();
  int port() const;
  void Shutdown();

  class Impl;

 private:
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_TCPSTORE_SERVER_H_
