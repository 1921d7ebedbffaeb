#include "runtime/comm/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/env_knobs.h"

namespace ember::comm {
namespace {

absl::StatusOr<sockaddr_in> Resolve(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return a;
}

class TcpChannel : public Channel {
 public:
  explicit TcpChannel(int fd) : fd_(fd), stage_(512 << 10) {
    int fl = fcntl(fd_, F_GETFL, 0);
    fcntl(fd_, F_SETFL, fl | O_NONBLOCK);
  }
  ~TcpChannel() override { close(fd_); }

  absl::StatusOr<size_t> TrySend(const void* data, size_t n) override {
    if (n == 0) return size_t{0};
    ssize_t r = send(fd_, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r >= 0) return static_cast<size_t>(r);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return size_t{0};
    return PeerGone(errno);
  }

  absl::StatusOr<size_t> TryRecv(void* dst, size_t n) override {
    size_t done = 0;
    if (beg_ < end_) {
      done = std::min(n, end_ - beg_);
      std::memcpy(dst, stage_.data() + beg_, done);
      beg_ += done;
      if (done == n) return done;
    }
    ssize_t r = recv(fd_, static_cast<char*>(dst) + done, n - done, MSG_DONTWAIT);
    if (r > 0) return done + static_cast<size_t>(r);
    if (r == 0) return PeerGone(0);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return done;
    return PeerGone(errno);
  }

  absl::StatusOr<ReadSpan> Peek(size_t max) override {
    if (beg_ == end_) {
      beg_ = end_ = 0;
      ssize_t r = recv(fd_, stage_.data(), stage_.size(), MSG_DONTWAIT);
      if (r == 0) return PeerGone(0);
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return ReadSpan{};
        return PeerGone(errno);
      }
      end_ = static_cast<size_t>(r);
    }
    return ReadSpan{stage_.data() + beg_, std::min(max, end_ - beg_)};
  }

  void Consume(size_t n) override { beg_ += n; }
  int fd() const override { return fd_; }
  bool is_shm() const override { return false; }
  void Shutdown() override { shutdown(fd_, SHUT_RDWR); }

 private:
  absl::Status PeerGone(int err) {
    if (err == 0) return absl::UnavailableError("peer closed the TCP connection (process gone or aborted)");
    return absl::UnavailableError(absl::StrCat("TCP connection to peer failed: ", strerror(err)));
  }
  int fd_;
  std::vector<char> stage_;
  size_t beg_ = 0, end_ = 0;
};

}  // namespace

void TuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Congestion control: CUBIC unless EMBER_COMM_TCP_CONGESTION names another ("system": leave the
  // kernel's default). Where BBR is the default it paces these bulk transfers and sizes their
  // segments from its rate estimate, which cost 20-50% more CPU per byte across veth than CUBIC
  // (docs/comm.md); the kernel refuses a name outside net.ipv4.tcp_allowed_congestion_control for
  // unprivileged processes, and the default stays then.
  const char* cc = getenv(kEnvTcpCongestion);
  if (cc == nullptr || *cc == '\0') cc = "cubic";
  if (std::strcmp(cc, "system") != 0) {
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, static_cast<socklen_t>(std::strlen(cc)));
  }
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(const std::string& host) {
  ASSIGN_OR_RETURN(sockaddr_in a, Resolve(host, 0));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return base::ErrnoToStatus(errno, "socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 128) != 0) {
    int err = errno;
    close(fd);
    return base::ErrnoToStatus(err, absl::StrCat("bind/listen on ", host));
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return std::unique_ptr<TcpListener>(new TcpListener(fd, ntohs(a.sin_port)));
}

TcpListener::~TcpListener() { close(fd_); }

absl::StatusOr<int> TcpListener::Accept(absl::Duration timeout) {
  pollfd p{fd_, POLLIN, 0};
  int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(timeout), 1 << 30));
  int rc = poll(&p, 1, ms);
  if (rc == 0) return absl::DeadlineExceededError("timed out waiting for peers to connect");
  if (rc < 0) return base::ErrnoToStatus(errno, "poll(accept)");
  int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) return base::ErrnoToStatus(errno, "accept");
  TuneSocket(c);
  return c;
}

absl::StatusOr<int> TcpConnect(const std::string& host, int port, absl::Duration timeout) {
  ASSIGN_OR_RETURN(sockaddr_in a, Resolve(host, port));
  absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(5);
  while (true) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return base::ErrnoToStatus(errno, "socket");
    TuneSocket(fd);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    int err = errno;
    close(fd);
    if (absl::Now() > deadline)
      return base::ErrnoToStatus(err, absl::StrCat("connect to ", host, ":", port));
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

absl::Status WriteFull(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return base::ErrnoToStatus(errno, "send");
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::Status ReadFull(int fd, void* data, size_t n, absl::Duration timeout) {
  char* p = static_cast<char*>(data);
  absl::Time deadline = absl::Now() + timeout;
  while (n > 0) {
    int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    pollfd pf{fd, POLLIN, 0};
    int rc = poll(&pf, 1, ms);
    if (rc == 0) return absl::DeadlineExceededError("timed out reading from peer during bootstrap");
    if (rc < 0) {
      if (errno == EINTR) continue;
      return base::ErrnoToStatus(errno, "poll");
    }
    ssize_t r = recv(fd, p, n, 0);
    if (r == 0) return absl::UnavailableError("peer closed the connection during bootstrap");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return base::ErrnoToStatus(errno, "recv");
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

std::unique_ptr<Channel> MakeTcpChannel(int fd) { return std::make_unique<TcpChannel>(fd); }

}  // namespace ember::comm
