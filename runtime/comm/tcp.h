// TCP transport: a listening socket, blocking connect/accept helpers for bootstrap, and a
// non-blocking Channel over a connected socket (with a small receive staging buffer so Peek can
// hand out contiguous spans). Thread-compatible per direction.
#ifndef EMBER_RUNTIME_COMM_TCP_H_
#define EMBER_RUNTIME_COMM_TCP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/channel.h"

namespace ember::comm {

// A bound, listening socket on `host` (port 0 = ephemeral). Owns the fd.
class TcpListener {
 public:
  static absl::StatusOr<std::unique_ptr<TcpListener>> Listen(const std::string& host);
  ~TcpListener();
  int port() const { return port_; }
  // Accepts one connection (blocking up to `timeout`); returns an owned fd.
  absl::StatusOr<int> Accept(absl::Duration timeout);

 private:
  TcpListener(int fd, int port) : fd_(fd), port_(port) {}
  int fd_;
  int port_;
};

// Connects to host:port, retrying refused connections until `timeout`. Returns an owned fd tuned
// by TuneSocket, still blocking.
absl::StatusOr<int> TcpConnect(const std::string& host, int port, absl::Duration timeout);

// Blocking exact read/write used during bootstrap.
absl::Status WriteFull(int fd, const void* data, size_t n);
absl::Status ReadFull(int fd, void* data, size_t n, absl::Duration timeout);

// Tunes a socket: TCP_NODELAY, 4 MiB buffers, and CUBIC congestion control unless
// EMBER_COMM_TCP_CONGESTION names another ("system": the kernel's default; a name the kernel
// refuses leaves the default too).
void TuneSocket(int fd);

// Takes ownership of `fd` (made non-blocking).
std::unique_ptr<Channel> MakeTcpChannel(int fd);

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_TCP_H_
