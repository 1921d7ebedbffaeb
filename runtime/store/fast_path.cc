// Plain-TCP fast path of the store: one epoll thread reads frames and executes them; responses are
// written by whichever thread produces them (the I/O thread, or the thread that woke a waiter).
#include "runtime/store/fast_path.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "runtime/base/grpc_server.h"
#include "runtime/base/little_endian.h"
#include "runtime/base/status_macros.h"
#include "spdlog/spdlog.h"

namespace ember::store {
namespace {

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}


}  // namespace

class FastPathServer::Impl {
 public:
  struct Conn {
    uint64_t id = 0;
    absl::Mutex mu;
    int fd ABSL_GUARDED_BY(mu) = -1;
    std::string out ABSL_GUARDED_BY(mu);          // bytes not yet written (EPOLLOUT armed)
    v1::ResponseBatch queued ABSL_GUARDED_BY(mu);  // responses not yet serialized
    int64_t queued_bytes ABSL_GUARDED_BY(mu) = 0;  // serialized size of `queued`
    bool hold ABSL_GUARDED_BY(mu) = false;         // I/O thread is executing a batch: coalesce
    bool overflow ABSL_GUARDED_BY(mu) = false;     // unsent output passed the limit: closing
    std::string in;                                // I/O thread only
    bool authed = false;                           // I/O thread only
    absl::Time accepted;                           // I/O thread only
    std::string peer;                              // I/O thread only: IP, or uid for Unix
  };

  Impl(Backend* backend, std::string token, FastPathLimits limits)
      : backend_(backend), token_(std::move(token)), limits_(limits) {}

  ~Impl() { Stop(); }

  absl::Status Listen(const std::string& host, int port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return base::ErrnoToStatus(errno, "fast path socket");
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    std::string h = host.empty() || host == "localhost" ? "127.0.0.1" : host;
    if (h == "0.0.0.0" || h == "[::]") h = "0.0.0.0";
    if (inet_pton(AF_INET, h.c_str(), &addr.sin_addr) != 1) {
      addrinfo hints{}, *res = nullptr;
      hints.ai_family = AF_INET;
      if (getaddrinfo(h.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("fast path: cannot resolve host '", h, "'"));
      }
      addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
      freeaddrinfo(res);
    }
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return base::ErrnoToStatus(errno, absl::StrCat("fast path bind ", h, ":", port));
    }
    if (listen(listen_fd_, 4096) != 0) return base::ErrnoToStatus(errno, "fast path listen");
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;  // TCP listener
    epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    // Same-host clients: an abstract Unix socket named after the TCP port (per network namespace,
    // like the loopback address clients use to find it). Cheaper per message than TCP loopback.
    unix_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (unix_fd_ >= 0) {
      sockaddr_un ua{};
      socklen_t ulen = FastPathUnixAddress(port_, &ua);
      if (bind(unix_fd_, reinterpret_cast<sockaddr*>(&ua), ulen) == 0 && listen(unix_fd_, 4096) == 0) {
        ev.data.u64 = 2;  // Unix listener
        epoll_ctl(epfd_, EPOLL_CTL_ADD, unix_fd_, &ev);
      } else {
        spdlog::warn("store fast path: no same-host Unix socket ({}); clients use TCP", strerror(errno));
        close(unix_fd_);
        unix_fd_ = -1;
      }
    }
    ev.data.u64 = 1;  // wake
    epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    loop_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    if (loop_.joinable()) loop_.join();
    while (!conns_.empty()) Drop(conns_.begin());
    if (listen_fd_ >= 0) close(listen_fd_);
    if (unix_fd_ >= 0) close(unix_fd_);
    if (epfd_ >= 0) close(epfd_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  int port() const { return port_; }

 private:
  static constexpr uint64_t kFirstConnId = 16;

  void Loop() {
    epoll_event events[128];
    // After activity, poll without sleeping for a short while: on a mostly idle host the next
    // request of a one-op-at-a-time caller usually arrives within microseconds, and waking a
    // sleeping thread costs more than that. Bounded, so an idle server does not burn a core, and
    // only while there are few connections per CPU (with many, spinning takes the CPU from the
    // very clients it waits for).
    constexpr int64_t kBusyPollNs = 30'000;
    const size_t spin_max_conns = 2 * static_cast<size_t>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    int64_t last_activity = 0;
    while (!stopped_) {
      const int64_t now = MonoNs();
      const bool spin = conns_.size() <= spin_max_conns && now - last_activity < kBusyPollNs;
      int n = epoll_wait(epfd_, events, 128, spin ? 0 : 200);
      if (n > 0) last_activity = MonoNs();
      if (n == 0 && spin) continue;
      CloseSilentConnections();
      for (int i = 0; i < n; ++i) {
        uint64_t tag = events[i].data.u64;
        if (tag == 0 || tag == 2) {
          Accept(tag == 0 ? listen_fd_ : unix_fd_);
        } else if (tag == 1) {
          uint64_t v;
          (void)!read(wake_fd_, &v, sizeof(v));
        } else {
          auto it = conns_.find(tag);
          if (it == conns_.end()) continue;
          std::shared_ptr<Conn> c = it->second;
          bool ok = true;
          if (events[i].events & EPOLLOUT) ok = WritePending(c);
          if (ok && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) ok = ReadFrames(c);
          if (!ok) Drop(it);
        }
      }
    }
  }

  using ConnMap = std::map<uint64_t, std::shared_ptr<Conn>>;

  // A connection that has not authenticated within the handshake timeout is closed, so idle or
  // half-open sockets cannot pile up (dead authenticated peers are found by TCP keepalive).
  void CloseSilentConnections() {
    absl::Time now = absl::Now();
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto next = std::next(it);
      if (!it->second->authed && now - it->second->accepted > limits_.handshake_timeout) Drop(it);
      it = next;
    }
  }

  // Closes a connection and forgets it (its waiters are cancelled).
  void Drop(ConnMap::iterator it) {
    std::shared_ptr<Conn> c = it->second;
    conns_.erase(it);
    buffered_in_ -= static_cast<int64_t>(c->in.size());
    if (--per_peer_[c->peer] <= 0) per_peer_.erase(c->peer);
    CloseConn(c);
  }

  // Closes the oldest connection that has not authenticated (of `peer`, if not empty).
  bool DropOldestUnauthenticated(const std::string& peer) {
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
      if (!it->second->authed && (peer.empty() || it->second->peer == peer)) {
        Drop(it);
        return true;
      }
    }
    return false;
  }

  void LogRefusal(const std::string& what) { refusals_.Refused(what); }

  // Whether a new connection from `peer` fits the limits, after closing the oldest
  // unauthenticated connection (of that peer, then of anyone) to make room.
  bool Admit(const std::string& peer) {
    auto pp = per_peer_.find(peer);
    if (pp != per_peer_.end() && pp->second >= limits_.max_connections_per_peer &&
        !DropOldestUnauthenticated(peer)) {
      LogRefusal(absl::StrCat("refused a connection from ", peer, ": it already has ",
                              limits_.max_connections_per_peer,
                              " authenticated connections (max_connections_per_peer)"));
      return false;
    }
    if (static_cast<int>(conns_.size()) >= limits_.max_connections &&
        !DropOldestUnauthenticated("")) {
      LogRefusal(absl::StrCat("refused a connection from ", peer, ": ", conns_.size(),
                              " authenticated connections open (max_connections)"));
      return false;
    }
    return true;
  }

  // accept() failed with EMFILE/ENFILE: close the pending connection and the oldest
  // unauthenticated one.
  void ShedOneConnection(int listener) {
    LogRefusal("out of file descriptors; closing a pending connection (raise LimitNOFILE)");
    DropOldestUnauthenticated("");
    spare_.Shed(listener);
  }

  static std::string PeerKey(int fd, const sockaddr_storage& ss) {
    char buf[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
    } else if (ss.ss_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
    } else {
      ucred cred{};
      socklen_t len = sizeof(cred);
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
      return absl::StrCat("uid ", cred.uid);
    }
    return buf;
  }

  void Accept(int listener) {
    while (true) {
      sockaddr_storage ss{};
      socklen_t sl = sizeof(ss);
      int fd = accept4(listener, reinterpret_cast<sockaddr*>(&ss), &sl,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0 && errno == EINTR) continue;
      if (fd < 0 && (errno == EMFILE || errno == ENFILE)) ShedOneConnection(listener);
      if (fd < 0) return;
      std::string peer = PeerKey(fd, ss);
      if (!Admit(peer)) {
        close(fd);
        continue;
      }
      TuneFastPathSocket(fd);
      auto c = std::make_shared<Conn>();
      c->id = next_conn_++;
      c->accepted = absl::Now();
      c->peer = peer;
      ++per_peer_[peer];
      {
        absl::MutexLock l(&c->mu);
        c->fd = fd;
      }
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = c->id;
      epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
      conns_[c->id] = c;
    }
  }

  // Reads what is available and executes complete frames. False = close the connection.
  bool ReadFrames(const std::shared_ptr<Conn>& c) {
    int fd;
    {
      absl::MutexLock l(&c->mu);
      fd = c->fd;
    }
    char buf[64 << 10];
    while (true) {
      // Before the handshake only one small frame is accepted: never buffer more than that.
      size_t want = sizeof(buf);
      if (!c->authed) {
        size_t cap = size_t{limits_.max_handshake_frame_bytes} + 4;
        if (c->in.size() >= cap) {
          LogRefusal(absl::StrCat("closed a connection from ", c->peer, " that sent more than ",
                                  cap, " bytes before authenticating"));
          return false;
        }
        want = std::min(want, cap + 1 - c->in.size());
      }
      ssize_t k = read(fd, buf, want);
      if (k > 0) {
        c->in.append(buf, k);
        buffered_in_ += k;
        if (buffered_in_ > limits_.max_buffered_input_bytes) {
          LogRefusal(absl::StrCat("closed a connection from ", c->peer, ": ", buffered_in_,
                                  " bytes of partial requests buffered across connections, above "
                                  "max_buffered_input_bytes=", limits_.max_buffered_input_bytes));
          return false;
        }
        if (k < static_cast<ssize_t>(want)) break;
        continue;
      }
      if (k == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    // Answers to every frame read in this round go out together.
    {
      absl::MutexLock l(&c->mu);
      c->hold = true;
    }
    size_t pos = 0;
    bool ok = ParseAndHandle(c, &pos);
    {
      absl::MutexLock l(&c->mu);
      c->hold = false;
    }
    FlushQueued(c);
    c->in.erase(0, pos);
    buffered_in_ -= static_cast<int64_t>(pos);
    if (c->in.empty() && c->in.capacity() > (1 << 20)) std::string().swap(c->in);
    return ok;
  }

  bool ParseAndHandle(const std::shared_ptr<Conn>& c, size_t* pos_out) {
    size_t& pos = *pos_out;
    while (c->in.size() - pos >= 4) {
      uint32_t len = base::LoadU32LE(c->in.data() + pos);
      uint32_t limit = c->authed ? kMaxFastFrameBytes : limits_.max_handshake_frame_bytes;
      if (len > limit) {
        LogRefusal(absl::StrCat("closed a connection from ", c->peer, " that sent a ", len,
                                "-byte frame (limit ", limit,
                                c->authed ? ")" : " before authenticating)"));
        return false;
      }
      if (c->in.size() - pos - 4 < len) break;
      v1::RequestBatch batch;
      if (!batch.ParseFromArray(c->in.data() + pos + 4, static_cast<int>(len))) {
        spdlog::warn("store fast path: closing a connection that sent an unparsable frame");
        return false;
      }
      pos += 4 + len;
      if (!Handle(c, batch)) return false;
    }
    return true;
  }

  bool Handle(const std::shared_ptr<Conn>& c, const v1::RequestBatch& batch) {
    if (!c->authed) {
      v1::ResponseBatch hello;
      if (!token_.empty() && !base::ConstantTimeEquals(token_, batch.auth_token())) {
        spdlog::warn("store fast path: rejected a connection with a missing or wrong auth token");
        auto* r = hello.add_responses();
        r->set_code(static_cast<int>(absl::StatusCode::kUnauthenticated));
        r->set_message("missing or wrong auth token (see --auth-token-file)");
        Send(c, hello);
        return false;
      }
      c->authed = true;
      auto* id = hello.add_responses();
      id->set_message(kFastPathHello);
      Send(c, hello);
      if (batch.requests_size() == 0) return true;
    }
    std::vector<const v1::Request*> reqs;
    reqs.reserve(batch.requests_size());
    for (const auto& r : batch.requests()) reqs.push_back(&r);
    std::weak_ptr<Conn> weak = c;  // c->hold is set by ReadFrames: answers are coalesced
    backend_->Execute(
        reqs,
        [this, weak](v1::Response r) {
          std::shared_ptr<Conn> conn = weak.lock();
          if (!conn) return;
          bool flush;
          {
            absl::MutexLock l(&conn->mu);
            conn->queued_bytes += static_cast<int64_t>(r.ByteSizeLong()) + 8;
            *conn->queued.add_responses() = std::move(r);
            flush = !conn->hold;
          }
          if (flush) FlushQueued(conn);
        },
        c->id);
    return true;
  }

  void Send(const std::shared_ptr<Conn>& c, const v1::ResponseBatch& b) {
    std::string payload = b.SerializeAsString();
    std::string frame;
    base::AppendU32LE(static_cast<uint32_t>(payload.size()), &frame);
    frame += payload;
    absl::MutexLock l(&c->mu);
    WriteLocked(c.get(), std::move(frame));
  }

  // Serializes the queued responses into frames of at most kMaxFastFrameBytes and writes them.
  void FlushQueued(const std::shared_ptr<Conn>& c) {
    absl::MutexLock l(&c->mu);
    if (c->queued.responses_size() == 0 || c->fd < 0) return;
    if (c->queued_bytes <= kMaxFastFrameBytes) {
      WriteFrameLocked(c.get(), c->queued);
    } else {
      // Many large answers at once (each is at most max_response_bytes): split.
      v1::ResponseBatch part;
      int64_t part_bytes = 0;
      for (v1::Response& r : *c->queued.mutable_responses()) {
        int64_t b = static_cast<int64_t>(r.ByteSizeLong()) + 8;
        if (part.responses_size() > 0 && part_bytes + b > kMaxFastFrameBytes) {
          WriteFrameLocked(c.get(), part);
          part.Clear();
          part_bytes = 0;
        }
        part_bytes += b;
        *part.add_responses() = std::move(r);
      }
      WriteFrameLocked(c.get(), part);
    }
    c->queued.Clear();
    c->queued_bytes = 0;
  }

  void WriteFrameLocked(Conn* c, const v1::ResponseBatch& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
    std::string frame;
    frame.reserve(b.ByteSizeLong() + 4);
    base::AppendU32LE(static_cast<uint32_t>(b.ByteSizeLong()), &frame);
    b.AppendToString(&frame);
    WriteLocked(c, std::move(frame));
  }

  // REQUIRES c->mu. Writes now if nothing is pending; leftovers wait for EPOLLOUT.
  void WriteLocked(Conn* c, std::string data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
    if (c->fd < 0 || c->overflow) return;
    if (!c->out.empty()) {
      if (!CheckUnsentLocked(c, c->out.size() + data.size())) return;
      c->out += data;
      return;
    }
    size_t off = 0;
    while (off < data.size()) {
      ssize_t k = send(c->fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (k > 0) {
        off += k;
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return;  // broken: the read side will notice and close
    }
    if (off < data.size()) {
      if (!CheckUnsentLocked(c, data.size() - off)) return;
      c->out = data.substr(off);
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT;
      ev.data.u64 = c->id;
      epoll_ctl(epfd_, EPOLL_CTL_MOD, c->fd, &ev);
    }
  }

  // REQUIRES c->mu. False (and the connection is being closed) if `unsent` bytes would wait for a
  // peer beyond the limit: it stopped reading, or asked for more at once than the limit allows.
  // The I/O thread sees the shutdown and closes the connection (cancelling its waiters).
  bool CheckUnsentLocked(Conn* c, size_t unsent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
    if (static_cast<int64_t>(unsent) <= limits_.max_unsent_output_bytes) return true;
    spdlog::warn("store fast path: closing connection {}: {} bytes of answers unsent, above "
                 "max_unsent_output_bytes={} (the client stopped reading)",
                 c->id, unsent, limits_.max_unsent_output_bytes);
    c->overflow = true;
    std::string().swap(c->out);
    shutdown(c->fd, SHUT_RDWR);
    return false;
  }

  bool WritePending(const std::shared_ptr<Conn>& c) {
    absl::MutexLock l(&c->mu);
    while (!c->out.empty()) {
      ssize_t k = send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
      if (k > 0) {
        c->out.erase(0, k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = c->id;
    epoll_ctl(epfd_, EPOLL_CTL_MOD, c->fd, &ev);
    return true;
  }

  void CloseConn(const std::shared_ptr<Conn>& c) {
    backend_->CancelOwner(c->id);
    absl::MutexLock l(&c->mu);
    if (c->fd >= 0) {
      epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
      close(c->fd);
      c->fd = -1;
    }
  }

  Backend* const backend_;
  const std::string token_;
  const FastPathLimits limits_;
  base::SpareDescriptor spare_;  // given up to shed a connection when out of descriptors
  int listen_fd_ = -1, unix_fd_ = -1, epfd_ = -1, wake_fd_ = -1, port_ = 0;
  std::atomic<bool> stopped_{false};
  std::thread loop_;
  // Owners of fast-path connections use ids from a high range so they never collide with the
  // gRPC sessions' owner ids.
  uint64_t next_conn_ = (uint64_t{1} << 62) + kFirstConnId;
  // I/O thread only (and Stop after join):
  ConnMap conns_;                        // by id = age (oldest first)
  std::map<std::string, int> per_peer_;  // open connections per peer
  int64_t buffered_in_ = 0;              // sum of conns_' `in`
  base::RefusalLog refusals_{"store fast path"};
};

absl::StatusOr<std::unique_ptr<FastPathServer>> FastPathServer::Start(const std::string& host,
                                                                      int port, Backend* backend,
                                                                      std::string auth_token,
                                                                      FastPathLimits limits) {
  auto impl = std::make_unique<Impl>(backend, std::move(auth_token), limits);
  RETURN_IF_ERROR(impl->Listen(host, port));
  return std::unique_ptr<FastPathServer>(new FastPathServer(std::move(impl)));
}

FastPathServer::FastPathServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FastPathServer::~FastPathServer() { Stop(); }
int FastPathServer::port() const { return impl_->port(); }
void FastPathServer::Stop() { impl_->Stop(); }

}  // namespace ember::store
