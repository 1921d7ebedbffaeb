// The store client's fast-path transport: dialling ember-store's plain-TCP socket (or, for a
// loopback address, its abstract Unix socket) and the handshake that authenticates it. Reading and
// writing frames afterwards: client_framing.h; who reads when: client_connection.h.
//
// Thread-safety: thread-safe (no shared state).
#ifndef EMBER_RUNTIME_STORE_CLIENT_FAST_H_
#define EMBER_RUNTIME_STORE_CLIENT_FAST_H_

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/store/client.h"

namespace ember::store::client_internal {

// Lets another thread abort a DialFastPath in progress (a client being destroyed must not wait
// out a dial to a silent store). Thread-safe.
class DialCancel {
 public:
  // Shuts down the socket being dialled (its connect or handshake fails at once), and makes
  // every later dial with this object fail at once.
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  // DialFastPath's side: registers `fd` as the socket being dialled; false once cancelled.
  bool Begin(int fd) ABSL_LOCKS_EXCLUDED(mu_);
  // Unregisters it (before it is closed or handed over).
  void End() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// How long one read of the fast socket blocks (its SO_RCVTIMEO) before the reader re-checks
// whether it should still be reading.
constexpr int kReadSliceMs = 50;

// Connects to the fast path on `port` of options.address's host (the abstract Unix socket first
// when options.use_unix_socket and the host is loopback), sends the auth token and checks the
// server's hello. Returns the connected socket, owned by the caller, with TCP_NODELAY, keepalive
// and SO_RCVTIMEO = kReadSliceMs set. UNAVAILABLE when it cannot connect, or the port is not an
// ember-store fast path; the server's code (UNAUTHENTICATED) when it refuses the token. The
// connect and the hello each give up after options.dial_timeout, or when `cancel` (optional)
// is cancelled.
absl::StatusOr<int> DialFastPath(const ClientOptions& options, int port,
                                 DialCancel* cancel = nullptr);

}  // namespace ember::store::client_internal

#endif  // EMBER_RUNTIME_STORE_CLIENT_FAST_H_
