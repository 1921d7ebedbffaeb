// TcpStoreServer: torch 1.13's and 2.x's TCPStore protocols (see tcpstore_server.h). Wire format
// (c10d tcputil, both): a query is one byte of QueryType, then its arguments; a string or byte
// vector is a u64 (host order = little-endian) length then the bytes; integers are raw
// little-endian (8 bytes; 2.x's validation magic and ping nonce 4). Replies: GET, COMPARE_SET
// and each MULTI_GET value a byte vector; ADD, GETNUMKEYS, DELETE_KEY an int64; CHECK, WAIT and
// CANCEL_WAIT one byte; PING the nonce; SET, APPEND, MULTI_SET and VALIDATE nothing.
#include "runtime/store/tcpstore_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"

namespace ember::store {
namespace {

// What a query asks, whichever protocol numbered it.
enum class Op {
  kValidate, kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kWatchKey, kDelete, kAppend,
  kMultiGet, kMultiSet, kCancelWait, kPing, kUnknown
};

// torch 1.13: torch/csrc/distributed/c10d/TCPStore.cpp, enum class QueryType : uint8_t
// (SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, WATCH_KEY, DELETE_KEY).
Op FromV1(uint8_t t) {
  static constexpr Op kOps[] = {Op::kSet,  Op::kCompareSet, Op::kGet,      Op::kAdd,   Op::kCheck,
                                Op::kWait, Op::kNumKeys,    Op::kWatchKey, Op::kDelete};
  return t < std::size(kOps) ? kOps[t] : Op::kUnknown;
}

// torch 2.x: torch/csrc/distributed/c10d/TCPStoreBackend.hpp, enum class QueryType : uint8_t as
// of pytorch/pytorch commit 0278b21833d7 (VALIDATE .. CANCEL_WAIT) and tag v2.8.0-rc4 (adds PING,
// QUEUE_PUSH, QUEUE_POP, QUEUE_LEN); client side: TCPStore.cpp of the same releases (validate(),
// ping(), doWait(), multiGet(), multiSet()). The queue ops (14-16; the libuv server only) and
// anything newer are not served: the connection is closed naming the query type.
Op FromV2(uint8_t t) {
  static constexpr Op kOps[] = {
      Op::kValidate, Op::kSet,      Op::kCompareSet, Op::kGet,      Op::kAdd,
      Op::kCheck,    Op::kWait,     Op::kNumKeys,    Op::kDelete,   Op::kAppend,
      Op::kMultiGet, Op::kMultiSet, Op::kCancelWait, Op::kPing};
  return t < std::size(kOps) ? kOps[t] : Op::kUnknown;
}
constexpr uint32_t kValidationMagic = 0x3C85F7CE;  // c10d::detail::validationMagicNumber (2.x)
constexpr uint8_t kV2CancelWait = 12;

constexpr uint8_t kCheckReady = 0, kCheckNotReady = 1;  // CheckResponseType
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;  // WaitResponseType (WAIT_CANCELED: 2.x)
constexpr uint64_t kMaxBytes = uint64_t{1} << 30;       // larger lengths are garbage: close

std::atomic<uint64_t> g_next_owner{uint64_t{1} << 62};  // apart from the gRPC/fast-path owners

class Connection {
 public:
  Connection(int fd, Backend* backend, const std::string& prefix)
      : fd_(fd), backend_(backend), prefix_(prefix) {}

  // Serves queries until the peer closes, a query fails or the server stops.
  void Serve() {
    v2_ = SpeaksV2();
    uint8_t type;
    while (Read(&type, 1)) {
      absl::Status s = Handle(v2_ ? FromV2(type) : FromV1(type), type);
      if (!s.ok()) {
        if (absl::IsCancelled(s)) {
          spdlog::debug("store: TCPStore client went away: {}", s.ToString());
        } else {
          spdlog::warn("store: TCPStore connection closed: {}", s.ToString());
        }
        break;
      }
    }
    backend_->CancelOwner(owner_);
  }

 private:
  // A 2.x client opens with VALIDATE (0) and the magic number; a 1.13 client's first query is
  // never that (a 1.13 SET of a key whose length starts with the magic would be a 1 GB key).
  bool SpeaksV2() {
    uint8_t head[5];
    if (recv(fd_, head, 1, MSG_PEEK) != 1 || head[0] != 0) return false;
    if (recv(fd_, head, 5, MSG_PEEK | MSG_WAITALL) != 5) return false;  // (both send >= 5 bytes)
    uint32_t magic;
    std::memcpy(&magic, head + 1, 4);
    return magic == kValidationMagic;
  }

  absl::Status Handle(Op op, uint8_t type) {
    v1::Request q;
    q.set_id(1);
    switch (op) {
      case Op::kValidate: {
        uint32_t magic;
        if (!Read(&magic, 4)) return Closed();
        if (magic != kValidationMagic) {
          return absl::InvalidArgumentError(absl::StrCat(
              "TCPStore VALIDATE with magic number ", magic, ", not torch's ", kValidationMagic,
              ": not a TCPStore client"));
        }
        return absl::OkStatus();
      }
      case Op::kPing: {
        uint32_t nonce;
        if (!Read(&nonce, 4)) return Closed();
        return Write(&nonce, 4);
      }
      case Op::kCancelWait: {  // the wait it cancels already ended (Call stops it on arrival)
        uint8_t answer = kWaitCanceled;
        return Write(&answer, 1);
      }
      case Op::kAppend: {
        std::string k, v;
        if (!ReadString(&k) || !ReadString(&v)) return Closed();
        q.mutable_append()->set_key(StoreKey(k));
        q.mutable_append()->set_value(v);
        return Call(q).status();
      }
      case Op::kMultiSet: {
        uint64_t n;
        if (!Read(&n, 8) || n > kMaxBytes) return Closed();
        for (uint64_t i = 0; i < n; ++i) {
          std::string k, v;
          if (!ReadString(&k) || !ReadString(&v)) return Closed();
          auto* kv = q.mutable_multi_set()->add_kvs();
          kv->set_key(StoreKey(k));
          kv->set_value(v);
        }
        return Call(q).status();
      }
      case Op::kMultiGet: {
        uint64_t n;
        if (!Read(&n, 8) || n > kMaxBytes) return Closed();
        for (uint64_t i = 0; i < n; ++i) {
          std::string k;
          if (!ReadString(&k)) return Closed();
          q.mutable_multi_get()->add_keys(StoreKey(k));
        }
        q.mutable_multi_get()->set_wait(true);  // the client waited already
        auto r = Call(q);
        if (!r.ok()) return r.status();
        for (const std::string& v : r->multi_get().values()) RETURN_IF_ERROR(WriteString(v));
        return absl::OkStatus();
      }
      case Op::kSet: {
        std::string k, v;
        if (!ReadString(&k) || !ReadString(&v)) return Closed();
        q.mutable_set()->set_key(StoreKey(k));
        q.mutable_set()->set_value(v);
        return Call(q).status();
      }
      case Op::kCompareSet: {
        std::string k, expected, desired;
        if (!ReadString(&k) || !ReadString(&expected) || !ReadString(&desired)) return Closed();
        auto* c = q.mutable_compare_set();
        c->set_key(StoreKey(k));
        c->set_expected(expected);
        c->set_expect_absent(expected.empty());
        c->set_desired(desired);
        auto r = Call(q);
        if (!r.ok()) return r.status();
        // torch: a missing key with a non-empty expectation answers the expectation.
        const auto& a = r->compare_set();
        return WriteString(!a.exists() && !a.swapped() ? expected : a.current());
      }
      case Op::kGet: {
        std::string k;
        if (!ReadString(&k)) return Closed();
        q.mutable_get()->set_key(StoreKey(k));
        q.mutable_get()->set_wait(true);  // the client waited already; a wait costs nothing then
        auto r = Call(q);
        if (!r.ok()) return r.status();
        return WriteString(r->get().value());
      }
      case Op::kAdd: {
        std::string k;
        int64_t delta;
        if (!ReadString(&k) || !Read(&delta, 8)) return Closed();
        q.mutable_add()->set_key(StoreKey(k));
        q.mutable_add()->set_delta(delta);
        auto r = Call(q);
        if (!r.ok()) return r.status();
        int64_t v = r->add().value();
        return Write(&v, 8);
      }
      case Op::kCheck:
      case Op::kWait: {
        uint64_t n;
        if (!Read(&n, 8) || n > kMaxBytes) return Closed();
        auto* keys = op == Op::kCheck ? q.mutable_check()->mutable_keys()
                                      : q.mutable_wait()->mutable_keys();
        for (uint64_t i = 0; i < n; ++i) {
          std::string k;
          if (!ReadString(&k)) return Closed();
          keys->Add(StoreKey(k));
        }
        bool cancelled = false;
        // A 1.13 WAIT is answered by whoever completes it (below): the setter's thread then
        // writes every parked waiter's STOP_WAITING in a row, as torch's server loop does,
        // instead of waking each waiter's thread to write it (measured: the barrier's last step).
        const bool answered_by_done = op == Op::kWait && !v2_;
        auto r = Call(q, op == Op::kWait && v2_ ? &cancelled : nullptr, answered_by_done);
        if (cancelled) return absl::OkStatus();  // CANCEL_WAIT answers instead
        if (!r.ok()) return r.status();
        if (answered_by_done) return absl::OkStatus();
        uint8_t answer = op == Op::kWait ? kStopWaiting
                                         : (r->check().all_exist() ? kCheckReady : kCheckNotReady);
        return Write(&answer, 1);
      }
      case Op::kNumKeys: {
        q.mutable_num_keys()->set_prefix(prefix_);
        auto r = Call(q);
        if (!r.ok()) return r.status();
        int64_t n = r->num_keys().count();
        return Write(&n, 8);
      }
      case Op::kDelete: {
        std::string k;
        if (!ReadString(&k)) return Closed();
        q.mutable_delete_()->set_key(StoreKey(k));
        auto r = Call(q);
        if (!r.ok()) return r.status();
        int64_t n = r->delete_().deleted() ? 1 : 0;
        return Write(&n, 8);
      }
      case Op::kWatchKey:
        return absl::UnimplementedError("TCPStore watch_key is not supported by ember-store");
      case Op::kUnknown:
        break;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported TCPStore query type ", static_cast<int>(type), " from a torch ",
        v2_ ? "2.x" : "1.13", " client (ember-store serves 1.13's queries 0-8 except WATCH_KEY "
        "and 2.x's 0-13: no QUEUE_PUSH/POP/LEN or newer)"));
  }

  // Runs one request on the backend and waits for its answer; gives up (cancelling it) when the
  // peer hangs up meanwhile. With `cancelled`: a 2.x client that sends CANCEL_WAIT (its wait timed
  // out) while we wait cancels the request too, and *cancelled says so; the CANCEL_WAIT itself is
  // left to be read as the next query.
  // With `stop_waiting`, a successful answer is written to the peer (kStopWaiting) by the thread
  // that completes the request, before this call returns; a failed write returns Closed(). This
  // thread writes nothing meanwhile: it waits for the answer (and a 1.13 client sends nothing
  // before it has its reply).
  absl::StatusOr<v1::Response> Call(const v1::Request& q, bool* cancelled = nullptr,
                                    bool stop_waiting = false) {
    struct Slot {
      absl::Mutex mu;
      std::optional<v1::Response> r;
      bool write_failed = false;
    };
    auto slot = std::make_shared<Slot>();
    const int fd = stop_waiting ? fd_ : -1;
    backend_->Execute({&q}, [slot, fd](v1::Response r) {
      bool failed = false;
      if (fd >= 0 && r.code() == 0) {
        const uint8_t answer = kStopWaiting;
        ssize_t put;
        do put = send(fd, &answer, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (put < 0 && errno == EINTR);
        failed = put != 1;  // (a 1-byte reply never fills a socket buffer a client drains)
      }
      absl::MutexLock l(&slot->mu);
      slot->write_failed = failed;
      slot->r = std::move(r);
    }, owner_);
    absl::MutexLock l(&slot->mu);
    auto ready = [&slot]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return slot->r.has_value(); };
    // Cancelled again every 100 ms until answered: a request still being evaluated when the
    // first cancel came (etcd backend) parks afterwards and is caught by the next one.
    while (!slot->mu.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100))) {
      uint8_t c;
      const ssize_t n = PeekByte(&c);
      const bool gone = n == 0;
      const bool cancel = n == 1 && cancelled != nullptr && c == kV2CancelWait;
      if (gone || cancel) {
        if (cancel) *cancelled = true;
        slot->mu.Unlock();
        backend_->CancelOwner(owner_);
        slot->mu.Lock();
      }
    }
    if (cancelled != nullptr && *cancelled) return absl::CancelledError("wait cancelled");
    if (slot->write_failed) return Closed();
    if (slot->r->code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(slot->r->code()), slot->r->message());
    }
    return *slot->r;
  }

  // Reads exactly n bytes, from what an earlier recv buffered first. A query's fields come in
  // one recv (not one per field: measured 4 recvs per ADD before); rbuf_ is fixed-size, so a
  // connection still holds only the bytes that arrived.
  bool Read(void* buf, size_t n) {
    char* p = static_cast<char*>(buf);
    while (n > 0) {
      if (rpos_ < rlen_) {
        const size_t take = std::min(n, rlen_ - rpos_);
        std::memcpy(p, rbuf_.get() + rpos_, take);
        rpos_ += take;
        p += take;
        n -= take;
        continue;
      }
      const bool direct = n >= kReadBuffer;  // large values go straight to their string
      ssize_t got = recv(fd_, direct ? p : rbuf_.get(), direct ? n : kReadBuffer, 0);
      if (got <= 0) {
        if (got < 0 && errno == EINTR) continue;
        return false;
      }
      if (direct) {
        p += got;
        n -= static_cast<size_t>(got);
      } else {
        rpos_ = 0;
        rlen_ = static_cast<size_t>(got);
      }
    }
    return true;
  }
  // The next byte the peer sent, without consuming it: from rbuf_, else peeked on the socket
  // without blocking. 0 bytes = the peer closed; -1 = nothing yet.
  ssize_t PeekByte(uint8_t* c) {
    if (rpos_ < rlen_) {
      *c = static_cast<uint8_t>(rbuf_[rpos_]);
      return 1;
    }
    return recv(fd_, c, 1, MSG_PEEK | MSG_DONTWAIT);
  }
  // The buffer grows with the bytes that really arrive (1 MiB at a time), so a length field that
  // promises 1 GiB and sends nothing costs nothing: TCPStore clients do not authenticate.
  bool ReadString(std::string* s) {
    uint64_t n;
    if (!Read(&n, 8) || n > kMaxBytes) return false;
    s->clear();
    constexpr uint64_t kChunk = uint64_t{1} << 20;
    while (s->size() < n) {
      const size_t have = s->size();
      const size_t step = static_cast<size_t>(std::min<uint64_t>(kChunk, n - have));
      s->resize(have + step);
      if (!Read(s->data() + have, step)) return false;
    }
    return true;
  }
  absl::Status Write(const void* buf, size_t n) {
    const char* p = static_cast<const char*>(buf);
    while (n > 0) {
      ssize_t put = send(fd_, p, n, MSG_NOSIGNAL);
      if (put <= 0) {
        if (put < 0 && errno == EINTR) continue;
        return Closed();
      }
      p += put;
      n -= static_cast<size_t>(put);
    }
    return absl::OkStatus();
  }
  absl::Status WriteString(const std::string& s) {
    uint64_t n = s.size();
    std::string frame(reinterpret_cast<const char*>(&n), 8);
    frame += s;
    return Write(frame.data(), frame.size());
  }
  static absl::Status Closed() { return absl::CancelledError("peer closed the connection"); }

  // TCPStore sends "/k" for a user key "k": the store key is prefix_ + "k".
  std::string StoreKey(const std::string& k) const {
    return absl::StrCat(prefix_, absl::string_view(k).substr(!k.empty() && k[0] == '/' ? 1 : 0));
  }

  const int fd_;
  Backend* const backend_;
  const std::string prefix_;  // TcpStoreOptions::key_prefix
  const uint64_t owner_ = g_next_owner.fetch_add(1);
  static constexpr size_t kReadBuffer = 16 << 10;
  const std::unique_ptr<char[]> rbuf_{new char[kReadBuffer]};
  size_t rpos_ = 0, rlen_ = 0;  // rbuf_[rpos_, rlen_) arrived and is not consumed yet
  bool v2_ = false;  // torch 2.x's numbering (set by Serve from the first bytes)
};

}  // namespace

class TcpStoreServer::Impl {
 public:
  ~Impl() { Shutdown(); }

  absl::Status Listen(const std::string& host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("TCPStore host '", host, "': ", gai_strerror(rc)));
    }
    listen_fd_ = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool ok = listen_fd_ >= 0 && bind(listen_fd_, res->ai_addr, res->ai_addrlen) == 0 &&
                    listen(listen_fd_, 512) == 0;
    freeaddrinfo(res);
    if (!ok) {
      return absl::UnavailableError(absl::StrCat("cannot listen for TCPStore clients on ", host,
                                                 ":", port, ": ", strerror(errno)));
    }
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&a)->sin_port);
    accept_ = std::thread([this] { AcceptLoop(); });
    return absl::OkStatus();
  }

  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      absl::MutexLock l(&mu_);
      if (stop_) {
        close(fd);
        break;
      }
      Reap();
      if (conns_.size() >= options.max_connections) {  // a thread each: bounded, and no client authenticates
        close(fd);
        if (refused_++ % 1000 == 0) {
          spdlog::warn("tcpstore: refused a connection: {} open (the limit; {} refused so far)",
                       conns_.size(), refused_);
        }
        continue;
      }
      conns_[fd] = std::thread([this, fd] {
        Connection(fd, backend, options.key_prefix).Serve();
        ::shutdown(fd, SHUT_RDWR);  // the peer sees the end now; the fd closes at the next Reap
        absl::MutexLock l(&mu_);
        finished_.push_back(fd);
      });
      Reap();
    }
  }

  // Joins the threads of connections that ended (mu_ held).
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int fd : finished_) {
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      std::thread t = std::move(it->second);
      conns_.erase(it);
      mu_.Unlock();
      t.join();
      close(fd);
      mu_.Lock();
    }
    finished_.clear();
  }

  void Shutdown() {
    if (stop_.exchange(true)) return;
    if (accept_.joinable()) accept_.join();
    if (listen_fd_ >= 0) close(listen_fd_);
    std::map<int, std::thread> conns;
    {
      absl::MutexLock l(&mu_);
      conns.swap(conns_);
      for (auto& [fd, t] : conns) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& [fd, t] : conns) {
      t.join();
      close(fd);
    }
  }

  Backend* backend = nullptr;
  TcpStoreOptions options;
  int port_ = 0;

 private:
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread accept_;
  uint64_t refused_ = 0;  // accept thread only
  absl::Mutex mu_;
  std::map<int, std::thread> conns_ ABSL_GUARDED_BY(mu_);
  std::vector<int> finished_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    const std::string& host, int port, Backend* backend, TcpStoreOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->backend = backend;
  impl->options = options;
  absl::Status s = impl->Listen(host, port);
  if (!s.ok()) return s;
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreServer::~TcpStoreServer() { Shutdown(); }
int TcpStoreServer::port() const { return impl_->port_; }
void TcpStoreServer::Shutdown() { impl_->Shutdown(); }

}  // namespace ember::store
