#include "runtime/base/grpc_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/support/server_interceptor.h"
#include "spdlog/spdlog.h"

namespace ember::base {

// ---------------------------------------------------------------------------------------------
// ConnectionGate: accepts on the server's port, applies the limits, hands admitted sockets to
// gRPC. It keeps a duplicate of each admitted socket (never read) only to learn when the
// connection ends: gRPC shuts the socket down when it closes a connection, and the peer's close
// shows up too. So a gRPC connection costs two descriptors (ConnectionShare accounts for it).
class GateState {
 public:
  GateState(const GrpcServerOptions& o, int max_conns, int per_peer)
      : max_conns_(max_conns), per_peer_limit_(per_peer), grace_(o.unauthenticated_grace) {}
  ~GateState() { Stop(); }

  absl::Status Listen(const std::string& address, int* port) {
    std::string host = address.substr(0, address.rfind(':'));
    std::string port_str = address.substr(address.rfind(':') + 1);
    host = std::string(absl::StripSuffix(absl::StripPrefix(host, "["), "]"));
    if (host.empty() || host == "localhost") host = "127.0.0.1";
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
    if (rc != 0 || res == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", address, "': ",
                                                     gai_strerror(rc), "; check --listen"));
    }
    listen_fd_ = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1, zero = 0;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (res->ai_family == AF_INET6) {  // "[::]" also takes IPv4, as gRPC's own listener does
      setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    bool bound = listen_fd_ >= 0 && bind(listen_fd_, res->ai_addr, res->ai_addrlen) == 0 &&
                 listen(listen_fd_, 4096) == 0;
    int err = errno;
    freeaddrinfo(res);
    if (!bound) {
      return absl::UnavailableError(absl::StrCat("could not bind gRPC server to '", address,
                                                 "': ", strerror(err),
                                                 "; is the port in use? Pick another --listen"));
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
    *port = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                          : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd_;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    ev.data.fd = wake_fd_;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    return absl::OkStatus();
  }

  void Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor) {
    acceptor_ = std::move(acceptor);
    thread_ = std::thread([this] { Loop(); });
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    if (thread_.joinable()) thread_.join();
    absl::MutexLock l(&mu_);
    for (auto& [fd, c] : conns_) close(fd);
    conns_.clear();
    by_peer_.clear();
    for (int fd : {listen_fd_, epfd_, wake_fd_}) {
      if (fd >= 0) close(fd);
    }
  }

  // `grpc_peer` as ServerContext::peer() gives it ("ipv4:127.0.0.1:5000").
  void MarkAuthenticated(const std::string& grpc_peer) {
    absl::MutexLock l(&mu_);
    auto it = by_peer_.find(grpc_peer);
    if (it == by_peer_.end()) return;
    auto c = conns_.find(it->second);
    if (c != conns_.end()) c->second.authed = true;
  }

 private:
  struct Conn {
    std::string ip;         // per-peer key
    std::string grpc_peer;  // key of by_peer_
    absl::Time accepted;
    uint64_t seq = 0;       // admission order
    bool authed = false;
  };

  void Loop() {
    epoll_event events[64];
    while (!stopped_) {
      int n = epoll_wait(epfd_, events, 64, 500);
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == listen_fd_) {
          Accept();
        } else if (fd != wake_fd_) {
          absl::MutexLock l(&mu_);
          Forget(fd);  // the connection ended (either side)
        }
      }
    }
  }

  void Forget(int dup_fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = conns_.find(dup_fd);
    if (it == conns_.end()) return;
    auto p = by_peer_.find(it->second.grpc_peer);
    if (p != by_peer_.end() && p->second == dup_fd) by_peer_.erase(p);
    if (--per_ip_[it->second.ip] <= 0) per_ip_.erase(it->second.ip);
    epoll_ctl(epfd_, EPOLL_CTL_DEL, dup_fd, nullptr);
    close(dup_fd);
    conns_.erase(it);
  }

  // Closes the oldest unauthenticated connection past its grace period (of `ip` if not empty).
  bool CloseOldestUnauthenticated(const std::string& ip) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Time cutoff = absl::Now() - grace_;
    int victim = -1;
    uint64_t oldest = UINT64_MAX;
    for (const auto& [fd, c] : conns_) {
      if (!c.authed && c.accepted <= cutoff && c.seq < oldest && (ip.empty() || c.ip == ip)) {
        victim = fd;
        oldest = c.seq;
      }
    }
    if (victim < 0) return false;
    shutdown(victim, SHUT_RDWR);  // gRPC sees the socket end and drops the connection
    Forget(victim);
    return true;
  }

  void LogRefusal(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    refusals_.Refused(what);
  }

  bool Admit(const std::string& ip) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto pp = per_ip_.find(ip);
    if (pp != per_ip_.end() && pp->second >= per_peer_limit_ && !CloseOldestUnauthenticated(ip)) {
      LogRefusal(absl::StrCat("refused a connection from ", ip, ": it has ", pp->second,
                              " connections open (max_connections_per_peer=", per_peer_limit_,
                              ")"));
      return false;
    }
    if (static_cast<int>(conns_.size()) >= max_conns_ && !CloseOldestUnauthenticated("")) {
      LogRefusal(absl::StrCat("refused a connection from ", ip, ": ", conns_.size(),
                              " connections open (max_connections=", max_conns_, ")"));
      return false;
    }
    return true;
  }

  static void PeerNames(const sockaddr_storage& ss, std::string* ip, std::string* grpc_peer) {
    char buf[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
      inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
      *ip = buf;
      *grpc_peer = absl::StrCat("ipv4:", buf, ":", ntohs(a->sin_port));
    } else {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
      inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
      *ip = buf;
      if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {  // gRPC names these as IPv4
        *ip = std::string(absl::StripPrefix(*ip, "::ffff:"));
        *grpc_peer = absl::StrCat("ipv4:", *ip, ":", ntohs(a->sin6_port));
      } else {
        *grpc_peer = absl::StrCat("ipv6:[", buf, "]:", ntohs(a->sin6_port));
      }
    }
  }

  void Accept() {
    while (true) {
      sockaddr_storage ss{};
      socklen_t sl = sizeof(ss);
      int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &sl,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0 && errno == EINTR) continue;
      if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        Shed();
        return;
      }
      if (fd < 0) return;
      std::string ip, grpc_peer;
      PeerNames(ss, &ip, &grpc_peer);
      int dup_fd = -1;
      {
        absl::MutexLock l(&mu_);
        if (!Admit(ip)) {
          close(fd);
          continue;
        }
        dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (dup_fd < 0) {
          close(fd);
          LogRefusal("out of file descriptors; closed a new connection (raise LimitNOFILE)");
          continue;
        }
        epoll_event ev{};
        ev.events = EPOLLRDHUP;  // (EPOLLHUP and EPOLLERR are always reported)
        ev.data.fd = dup_fd;
        epoll_ctl(epfd_, EPOLL_CTL_ADD, dup_fd, &ev);
        Conn& c = conns_[dup_fd];
        c.ip = ip;
        c.grpc_peer = grpc_peer;
        c.accepted = absl::Now();
        c.seq = next_seq_++;
        c.authed = all_authed_;
        by_peer_[grpc_peer] = dup_fd;
        ++per_ip_[ip];
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
      p.listener_fd = listen_fd_;
      p.fd = fd;  // gRPC owns it now
      acceptor_->HandleNewConnection(&p);
    }
  }

  void Shed() {
    absl::MutexLock l(&mu_);
    LogRefusal("out of file descriptors; closing a pending connection (raise LimitNOFILE)");
    CloseOldestUnauthenticated("");
    spare_.Shed(listen_fd_);
  }

 public:
  bool all_authed_ = false;  // set before Start when the server has no token

 private:
  const int max_conns_;
  const int per_peer_limit_;
  const absl::Duration grace_;
  int listen_fd_ = -1, epfd_ = -1, wake_fd_ = -1;
  SpareDescriptor spare_;
  std::atomic<bool> stopped_{false};
  std::thread thread_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;

  absl::Mutex mu_;
  std::map<int, Conn> conns_ ABSL_GUARDED_BY(mu_);              // by duplicate descriptor
  std::map<std::string, int> by_peer_ ABSL_GUARDED_BY(mu_);     // gRPC peer name -> dup fd
  std::map<std::string, int> per_ip_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  RefusalLog refusals_ ABSL_GUARDED_BY(mu_){"gRPC server"};
};

// The owner handle kept in StartedServer: stops the accept loop when the server goes away. The
// state itself is shared with the interceptors, which gRPC may run until the server is destroyed.
class ConnectionGate {
 public:
  explicit ConnectionGate(std::shared_ptr<GateState> s) : state_(std::move(s)) {}
  ~ConnectionGate() { state_->Stop(); }

 private:
  std::shared_ptr<GateState> state_;
};

namespace {

// Marks the connection of every call that carries the token as authenticated.
class AuthMarker : public grpc::experimental::Interceptor {
 public:
  AuthMarker(grpc::experimental::ServerRpcInfo* info, GateState* gate, const std::string* bearer)
      : info_(info), gate_(gate), bearer_(bearer) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      auto* md = m->GetRecvInitialMetadata();
      auto it = md->find("authorization");
      if (it != md->end() && ConstantTimeEquals(*bearer_, absl::string_view(it->second.data(), it->second.size()))) {
        gate_->MarkAuthenticated(info_->server_context()->peer());
      }
    }
    m->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* info_;
  GateState* gate_;
  const std::string* bearer_;
};

class AuthMarkerFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  AuthMarkerFactory(std::shared_ptr<GateState> gate, std::string token)
      : gate_(std::move(gate)), bearer_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new AuthMarker(info, gate_.get(), &bearer_);
  }

 private:
  std::shared_ptr<GateState> gate_;
  const std::string bearer_;
};

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= a[i] ^ b[i];
  return d == 0;
}

void RefusalLog::Refused(const std::string& what) {
  absl::Time now = absl::Now();
  if (now - last_ < absl::Seconds(1)) {
    ++unlogged_;
    return;
  }
  spdlog::warn("{}: {} ({} similar refusals not logged)", who_, what, unlogged_);
  last_ = now;
  unlogged_ = 0;
}

SpareDescriptor::SpareDescriptor() : fd_(open("/dev/null", O_RDONLY | O_CLOEXEC)) {}
SpareDescriptor::~SpareDescriptor() {
  if (fd_ >= 0) close(fd_);
}
void SpareDescriptor::Shed(int listen_fd) {
  if (fd_ >= 0) close(fd_);
  int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) close(fd);
  fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

int64_t RaiseOpenFileLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t before = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) rl.rlim_cur = before;
  }
  return rl.rlim_cur == RLIM_INFINITY ? (int64_t{1} << 20) : static_cast<int64_t>(rl.rlim_cur);
}

int ConnectionShare(int parts) {
  rlimit rl{};
  int64_t soft = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                     ? static_cast<int64_t>(rl.rlim_cur)
                     : (int64_t{1} << 20);
  int64_t usable = soft - 64 - soft / 8;
  return static_cast<int>(std::clamp<int64_t>(usable / std::max(1, parts), 1, INT32_MAX));
}

absl::StatusOr<StartedServer> StartGrpcServer(const GrpcServerOptions& options,
                                              const std::vector<grpc::Service*>& services) {
  grpc::ServerBuilder builder;
  auto creds = options.credentials ? options.credentials : grpc::InsecureServerCredentials();
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Two servers must never share a port silently (gRPC enables SO_REUSEPORT by default).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Half-open or idle connections must not pin resources forever.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.handshake_timeout)));
  grpc::ResourceQuota quota("ember-grpc-server");
  quota.Resize(static_cast<size_t>(options.memory_quota_bytes));
  builder.SetResourceQuota(quota);
  for (grpc::Service* s : services) builder.RegisterService(s);

  StartedServer out;
  int port = 0;
  std::shared_ptr<GateState> gate;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor;
  if (absl::StartsWith(options.address, "unix:")) {
    builder.AddListeningPort(options.address, creds, &port);  // local only: no gate
  } else {
    int max_conns = options.max_connections > 0 ? options.max_connections
                                                : std::min(4096, ConnectionShare(8));
    int per_peer = options.max_connections_per_peer > 0 ? options.max_connections_per_peer
                                                        : std::max(1, max_conns / 2);
    gate = std::make_shared<GateState>(options, max_conns, per_peer);
    gate->all_authed_ = options.auth_token.empty();
    if (absl::Status s = gate->Listen(options.address, &port); !s.ok()) return s;
    acceptor = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, creds);
    if (!options.auth_token.empty()) {
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> f;
      f.push_back(std::make_unique<AuthMarkerFactory>(gate, options.auth_token));
      builder.experimental().SetInterceptorCreators(std::move(f));
    }
  }
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || port == 0) {
    if (gate) gate->Stop();
    return absl::UnavailableError(absl::StrCat(
        "could not bind gRPC server to '", options.address,
        "'; is the port in use or the host not local? Pick another --listen address"));
  }
  if (gate) {
    gate->Start(std::move(acceptor));
    out.gate = std::make_shared<ConnectionGate>(gate);
  }
  out.port = port;
  std::string host = options.address.substr(0, options.address.rfind(':'));
  out.address = absl::StrCat(host, ":", port);
  return out;
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace ember::base
