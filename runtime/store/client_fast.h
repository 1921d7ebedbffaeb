// The store client's fast-path transport: dialling ember-store's plain-TCP socket (or, for a
// loopback address, its abstract Unix socket) and the handshake that authenticates it. Reading and
// writing frames afterwards: client_framing.h; who reads when: client_connection.h.
//
// Thread-safety: thread-safe (no shared state).
#ifndef EMBER_RUNTIME_STORE_CLIENT_FAST_H_
#define EMBER_RUNTIME_STORE_CLIENT_FAST_H_

#include "absl/status/statusor.h"
#include "runtime/store/client.h"

namespace ember::store::client_internal {

// How long one read of the fast socket blocks (its SO_RCVTIMEO) before the reader re-checks
// whether it should still be reading.
constexpr int kReadSliceMs = 50;

// Connects to the fast path on `port` of options.address's host (the abstract Unix socket first
// when options.use_unix_socket and the host is loopback), sends the auth token and checks the
// server's hello. Returns the connected socket, owned by the caller, with TCP_NODELAY, keepalive
// and SO_RCVTIMEO = kReadSliceMs set. UNAVAILABLE when it cannot connect, or the port is not an
// ember-store fast path; the server's code (UNAUTHENTICATED) when it refuses the token. The
// connect and the hello each give up after options.dial_timeout.
absl::StatusOr<int> DialFastPath(const ClientOptions& options, int port);

}  // namespace ember::store::client_internal

#endif  // EMBER_RUNTIME_STORE_CLIENT_FAST_H_
