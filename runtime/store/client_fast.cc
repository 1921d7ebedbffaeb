// Dialling the store's fast path (see client_fast.h).
#include "runtime/store/client_fast.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/store.pb.h"
#include "runtime/store/client_framing.h"
#include "runtime/store/fast_path_protocol.h"

namespace ember::store::client_internal {
namespace {

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// connect() that gives up after `timeout_ms` (ETIMEDOUT) instead of after the kernel's SYN
// retries (about two minutes). Returns 0 or an errno; `fd` is blocking again on return.
int ConnectWithin(int fd, const sockaddr* addr, socklen_t len, int timeout_ms) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int err = 0;
  if (connect(fd, addr, len) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
      int n;
      do {
        const int left = static_cast<int>(
            std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
        n = poll(&p, 1, left);
      } while (n < 0 && errno == EINTR);
      socklen_t el = sizeof(err);
      if (n == 0) {
        err = ETIMEDOUT;
      } else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) {
        err = errno;
      }
    }
  }
  fcntl(fd, F_SETFL, flags);
  return err;
}

}  // namespace

void DialCancel::Cancel() {
  absl::MutexLock l(&mu_);
  cancelled_ = true;
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

bool DialCancel::Begin(int fd) {
  absl::MutexLock l(&mu_);
  if (cancelled_) return false;
  fd_ = fd;
  return true;
}

void DialCancel::End() {
  absl::MutexLock l(&mu_);
  fd_ = -1;
}

absl::StatusOr<int> DialFastPath(const ClientOptions& options, int port, DialCancel* cancel) {
  // Every socket made here is registered with `cancel` while it is being dialled.
  auto begin = [cancel](int fd) { return fd < 0 || cancel == nullptr || cancel->Begin(fd); };
  auto drop = [cancel](int fd) {
    if (cancel != nullptr) cancel->End();
    close(fd);
  };
  const absl::Status closing = absl::CancelledError("store client closing; dial abandoned");
  const int dial_ms = static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(options.dial_timeout), 1, 3600 * 1000));
  std::string host = options.address.substr(0, options.address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  int fd = -1;
  if (options.use_unix_socket && IsLoopback(host)) {
    // Same host: the server's abstract Unix socket, if it has one (else TCP below).
    sockaddr_un ua;
    socklen_t ulen = FastPathUnixAddress(port, &ua);
    // Bounded too: a blocking connect waits without limit while the server's accept queue is
    // full (a stopped or wedged server); non-blocking, that is EAGAIN at once (then TCP below).
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!begin(fd)) {
      close(fd);
      return closing;
    }
    if (fd >= 0 && ConnectWithin(fd, reinterpret_cast<sockaddr*>(&ua), ulen, dial_ms) != 0) {
      drop(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) {
      return absl::UnavailableError(absl::StrCat("cannot resolve store host '", host, "'"));
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!begin(fd)) {
      freeaddrinfo(res);
      close(fd);
      return closing;
    }
    int err = fd < 0 ? errno : ConnectWithin(fd, res->ai_addr, res->ai_addrlen, dial_ms);
    freeaddrinfo(res);
    if (err != 0) {
      if (fd >= 0) drop(fd);
      return absl::UnavailableError(absl::StrCat("connect to store fast path ", host, ":", port,
                                                 ": ", strerror(err)));
    }
  }
  TuneFastPathSocket(fd);
  v1::RequestBatch hello;
  hello.set_auth_token(options.auth_token);
  std::string reply;
  v1::ResponseBatch rb;
  if (!SendAll(fd, FrameOf(hello)) || !ReadFrame(fd, &reply, dial_ms) ||
      !rb.ParseFromString(reply)) {
    drop(fd);
    return absl::UnavailableError("store fast path closed during the handshake");
  }
  if (rb.responses_size() > 0 && rb.responses(0).code() != 0) {
    drop(fd);
    return absl::Status(static_cast<absl::StatusCode>(rb.responses(0).code()),
                        rb.responses(0).message());
  }
  if (rb.responses_size() != 1 || rb.responses(0).message() != kFastPathHello) {
    drop(fd);
    return absl::UnavailableError(
        absl::StrCat("port ", port, " is not an ember-store fast path"));
  }
  if (cancel != nullptr) cancel->End();
  timeval slice{0, kReadSliceMs * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof(slice));
  return fd;
}

}  // namespace ember::store::client_internal
