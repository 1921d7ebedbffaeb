// TcpStoreServer: PyTorch c10d TCPStore's wire protocol on the store's key space, so unmodified
// TCPStore clients rendezvous through ember-store (docs/store.md "TCPStore compatibility").
//
// Two protocols, told apart per connection by its first bytes: torch 1.13's (Debian's
// python3-torch; checked against the real client) and torch 2.x's, which opens with VALIDATE and
// a magic number and renumbered the query types (built from c10d's source, see the .cc; no 2.x
// client has been run against it here). 1.13: set, get, add, check, wait, compare_set,
// delete_key, num_keys; not watch_key. 2.x: those plus ping, append, multi_get, multi_set and
// cancel_wait (a wait that timed out on the client); not the queue ops (libuv server only).
// Unsupported queries close the connection, logged with the query type.
// Keys: TCPStore sends "/k" for a user key "k"; the leading '/' is dropped so that Ember clients
// see "k" (and torch sees Ember's "k" as "k"). With a key_prefix P every key is P + "k" and
// num_keys counts the keys under P only: a listener per prefix is a private key space (emberd
// starts one per script-job attempt on jobs/<job>/attempt/<n>/torch/).
// TCPStore has no authentication: whoever reaches the port can read and write every key under
// key_prefix ("" = every key of the store). It binds loopback unless the caller chooses another
// host; ember-store's --tcpstore-port requires a prefix outside emberd's key spaces.
//
// Serving: one epoll thread for all connections of a listener (nonblocking sockets). A blocking
// WAIT or GET is parked in the backend, not on a thread: the backend's completion callback writes
// the reply. A connection runs at most 256 queries a turn (pipelined ones wait for the
// next round), so one client cannot hold the thread. Bounds, since no client authenticates:
// max_connections; a string (key or value) of at most 1 GiB and a query of at most
// max_query_bytes, its buffer growing only as bytes arrive (a length prefix allocates nothing);
// a connection runs its next query only once the previous reply left, and is closed when a reply
// exceeds max_unsent_bytes unsent or the client reads none of it for write_stall_timeout.
//
// Listener-wide budget (max_buffered_bytes), over partial queries, unsent replies, the GET,
// MULTI_GET and COMPARE_SET requests kept until answered, and the WAITs parked in the backend (at
// most max_wait_bytes each; one over 64 KiB that does not fit, counting its own query buffer, is
// refused and its connection closed): while it is exceeded a connection growing a query past
// 64 KiB is not read, and an answer over 64 KiB that does not fit is not written: the read (or
// the compare that swapped nothing) runs again later, which is the same as receiving it later.
// Small queries, replies and WAITs go on being served. No deadlock: the oldest waiting grower
// holds a read turn until its query is whole, the oldest refused answer a reply turn until it
// left (or parked a second), each exempt from the budget; so the listener holds at most
// max_buffered_bytes + two queries (the read turn's, and the growth that crossed the budget) +
// one reply + about 320 KiB per connection (a small parked WAIT included). A read-turn holder
// that sends nothing for write_stall_timeout is closed, as is a reply nobody reads (a client
// reading a byte a minute keeps the reply turn: larger answers wait for it).
//
// Silent and slow clients: a query begun and not completed within idle_timeout closes its
// connection, and so does a connection that completed no query within idle_timeout of its accept
// while the table is at least half full; a full table evicts the oldest connection that completed
// no query for a new one (max_connections). Warnings (malformed queries, closes, evictions) are
// logged at most once a second per kind, with the count of those not logged.
//
// Thread-safety: Start/port/Shutdown from any thread. Shutdown() (and the destructor) closes the
// listener and every connection (their waiters are cancelled) and joins the loop thread.
#ifndef EMBER_RUNTIME_STORE_TCPSTORE_SERVER_H_
#define EMBER_RUNTIME_STORE_TCPSTORE_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/store/backend.h"

namespace ember::store {

struct TcpStoreOptions {
  // Open connections at most (TCPStore clients never authenticate). When the table is full, a
  // new connection evicts the oldest connection that has completed no query yet (a silent
  // socket; a rate-limited warning); if every one has, the new connection is closed at once,
  // with a warning at most once a second.
  size_t max_connections = 1024;
  // One query's bytes at most (its strings and their bookkeeping, tcpstore_protocol.h), checked at
  // each length prefix before the bytes arrive: the store's largest answer (BackendOptions::
  // max_response_bytes, 64 MiB) and a margin. A longer query closes the connection.
  size_t max_query_bytes = (size_t{64} << 20) + (size_t{1} << 20);
  // Reply bytes a connection may leave unsent (the socket buffer full): one reply, at most the
  // store's largest answer, and a margin. Above it the connection is closed.
  size_t max_unsent_bytes = (size_t{64} << 20) + (size_t{1} << 20);
  // Bytes the listener buffers over all connections (see above; 0 = no budget): partial queries,
  // kept requests, unsent replies.
  size_t max_buffered_bytes = size_t{256} << 20;
  // A connection whose client reads none of its pending reply for this long is closed (also the
  // read turn's holder over the budget that sends nothing of its query for this long).
  absl::Duration write_stall_timeout = absl::Seconds(60);
  // Every key is stored under this prefix ("" = the store's own key space).
  std::string key_prefix;
  // One WAIT's request bytes at most (its keys and their bookkeeping). A parked WAIT's keys stay
  // in the backend until it ends, charged to max_buffered_bytes meanwhile; a WAIT over this is
  // refused and its connection closed. torch waits on a few short keys.
  size_t max_wait_bytes = size_t{1} << 20;
  // A connection that completes no query for this long is closed: from the first byte of a
  // query until it is whole (time the listener itself does not read it, over the budget, is not
  // counted), and, while the table is at least half full (max_connections), from its accept
  // until its first query is whole. Between queries and while its WAIT or GET is parked a client
  // may stay silent for ever, and so may a connection that sent nothing while the table is less
  // than half full: torch's TCPStore opens such a connection (its watch_key callback client) and
  // ends the process when it is closed.
  absl::Duration idle_timeout = absl::Seconds(30);
};

class TcpStoreServer {
 public:
  // Listens on host:port (port 0 = any free port). `backend` is borrowed and must outlive the
  // server (StoreServer::backend()).
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, int port,
                                                               Backend* backend,
                                                               TcpStoreOptions options = {});
  ~TcpStoreServer();
  int port() const;
  // Bytes the listener holds now against max_buffered_bytes (tests, metrics; any thread).
  int64_t buffered_bytes() const;
  void Shutdown();

  class Impl;

 private:
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_TCPSTORE_SERVER_H_
