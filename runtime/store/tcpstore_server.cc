// TcpStoreServer: torch 1.13's and 2.x's TCPStore protocols (see tcpstore_server.h), served by one
// epoll thread. Replies (tcpstore_protocol.h has the query format): GET, COMPARE_SET and each
// MULTI_GET value a byte vector; ADD, GETNUMKEYS, DELETE_KEY an int64; CHECK, WAIT and
// CANCEL_WAIT one byte; PING the nonce; SET, APPEND, MULTI_SET and VALIDATE nothing.
//
// A connection runs its queries one at a time, in order: a query goes to the backend, and the
// next is parsed once the backend answered it and its reply left. The backend's completion
// callback writes the reply itself, on whatever thread completes the request (the loop thread for
// a query of a TCPStore client, including the SET that wakes a barrier's parked WAITs; a gRPC or
// etcd thread otherwise), and hands the connection back to the loop to resume its input.
#include "runtime/store/tcpstore_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runtime/base/grpc_server.h"
#include "runtime/store/tcpstore_budget.h"
#include "runtime/store/tcpstore_connection.h"
#include "runtime/store/tcpstore_protocol.h"
#include "spdlog/spdlog.h"

namespace ember::store {
namespace {

using tcpstore::Conn;
using tcpstore::MonoNs;
using tcpstore::Op;
using tcpstore::ReadyQueue;
using tcpstore::Turns;

// Backend owners of TCPStore connections: apart from the gRPC sessions' (from 1) and the fast
// path's ((1 << 62) + 16 upward); shared by every listener on a backend.
std::atomic<uint64_t> g_next_owner{uint64_t{3} << 61};

constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kMaxUnparsed = 64 << 10;  // input read ahead of the parser
// Queries one connection runs in a turn: a client pipelining a megabyte of one-byte queries
// resumes in the next round of the loop, after every other ready connection had its turn.
constexpr int kQueriesPerTurn = 256;
constexpr int64_t kRecancelNs = 100'000'000;

}  // namespace

class TcpStoreServer::Impl {
 public:
  Impl(Backend* backend, TcpStoreOptions options)
      : backend_(backend), options_(std::move(options)) {}
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
    listen_fd_ = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (listen_fd_ >= 0) setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool ok = listen_fd_ >= 0 && bind(listen_fd_, res->ai_addr, res->ai_addrlen) == 0 &&
                    listen(listen_fd_, 1024) == 0;
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
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0 || ready_->wake_fd < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("TCPStore listener: no epoll or eventfd descriptor: ", strerror(errno)));
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenTag;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    ev.data.u64 = kWakeTag;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, ready_->wake_fd, &ev);
    loop_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  void Shutdown() {
    if (stop_.exchange(true)) return;
    if (loop_.joinable()) {
      const uint64_t one = 1;
      (void)!write(ready_->wake_fd, &one, sizeof(one));
      loop_.join();
    }
    if (listen_fd_ >= 0) close(listen_fd_);
    while (!conns_.empty()) Close(conns_.begin()->second, "", nullptr);
    // A request still being evaluated when it was cancelled (etcd backend) parks afterwards: cancel
    // again until every one is answered, for at most a second.
    for (int i = 0; i < 100 && RecancelPending(/*force=*/true); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ready_->Stop();
    if (epfd_ >= 0) close(epfd_);
  }

  int port() const { return port_; }
  int64_t buffered_bytes() const { return budget_->held(); }

 private:
  static constexpr uint64_t kListenTag = 0, kWakeTag = 1;
  static constexpr uint32_t kUnregistered = ~uint32_t{0};  // Conn::events: removed from epoll

  void Loop() {
    ready_->MarkLoopThread();
    epoll_event events[256];
    int64_t last_stall_check = MonoNs();
    // Idle deadlines are checked four times per idle_timeout (at most once a second).
    const int64_t idle_ns = absl::ToInt64Nanoseconds(options_.idle_timeout);
    const int64_t sweep_ns = std::max<int64_t>(std::min<int64_t>(idle_ns / 4, 1'000'000'000),
                                               10'000'000);
    const int idle_wait_ms = static_cast<int>(sweep_ns / 1'000'000);
    while (!stop_) {
      const int timeout_ms = !backlog_.empty()      ? 0
                             : !cancelling_.empty() ? std::min(100, idle_wait_ms)
                                                    : idle_wait_ms;
      const int n = epoll_wait(epfd_, events, 256, timeout_ms);
      for (int i = 0; i < n; ++i) {
        const uint64_t tag = events[i].data.u64;
        if (tag == kListenTag) {
          Accept();
          continue;
        }
        if (tag == kWakeTag) {
          uint64_t v;
          (void)!read(ready_->wake_fd, &v, sizeof(v));
          continue;
        }
        auto it = conns_.find(tag);
        if (it == conns_.end()) continue;
        std::shared_ptr<Conn> c = it->second;
        const uint32_t e = events[i].events;
        if (e & (EPOLLERR | EPOLLHUP)) {  // reset: run what it sent before, then close
          OnReadable(c);
          c->eof = true;
          Pump(c);
          if (c->open) {  // waiting for an answer: no more events (HUP would repeat)
            absl::MutexLock l(&c->mu);
            epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
            c->events = kUnregistered;
          }
          continue;
        }
        if (e & EPOLLOUT) Flush(c);
        if (e & EPOLLIN) {
          OnReadable(c);
        } else {
          Pump(c);
        }
      }
      DrainReady();
      ResumeBacklog();
      Rebalance();
      if (!cancelling_.empty()) RecancelPending(/*force=*/false);
      if (const int64_t now = MonoNs(); now - last_stall_check >= sweep_ns) {
        last_stall_check = now;
        CloseStalledWriters(now);
        CloseIdle(now);
        warnings_.Flush(now);
      }
    }
    DrainReady();
  }

  void DrainReady() {
    while (true) {
      std::vector<std::shared_ptr<Conn>> ready = ready_->Take();
      if (ready.empty()) return;
      for (const auto& c : ready) Pump(c);
    }
  }

  // Passes the budget's turns on and resumes whom they concern (tcpstore_budget.h).
  void Rebalance() {
    for (int i = 0; i < 4; ++i) {  // a resumed connection may finish at once and pass a turn on
      std::vector<std::shared_ptr<Conn>> resume;
      turns_.Rebalance(MonoNs(), &resume);
      if (resume.empty()) return;
      for (const auto& c : resume) Pump(c);
    }
  }

  // Connections that used up their turn with queries left run their next turn.
  void ResumeBacklog() {
    std::vector<std::shared_ptr<Conn>> again;
    again.swap(backlog_);
    for (const auto& c : again) {
      c->backlogged = false;
      Pump(c);
    }
  }

  void Accept() {
    while (true) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          refusals_.Refused("out of file descriptors; closing a pending connection");
          spare_.Shed(listen_fd_);
        }
        return;  // EAGAIN: all accepted (after EMFILE: the next round takes the rest)
      }
      if (conns_.size() >= options_.max_connections) {  // no client authenticates: bounded
        std::shared_ptr<Conn> victim = OldestSilent();
        if (victim == nullptr) {
          close(fd);
          refusals_.Refused(absl::StrCat("refused a connection: ", conns_.size(),
                                         " open (max_connections)"));
          continue;
        }
        Close(victim, absl::StrCat("evicted for a new connection: ", conns_.size(),
                                   " open (max_connections); it was the oldest that completed no "
                                   "query"),
              "evicted");
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_shared<Conn>(fd, g_next_owner.fetch_add(1), options_.max_unsent_bytes,
                                      options_.max_query_bytes, budget_);
      c->idle_from_ns = c->last_input_ns = MonoNs();
      epoll_event ev{};
      ev.events = c->events = EPOLLIN;
      ev.data.u64 = c->owner;
      epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
      conns_[c->owner] = std::move(c);
    }
  }

  // Input is wanted unless a reply waits to leave or a refused request to run again, only a
  // little of it ahead of the parser (a request is outstanding: enough to see a CANCEL_WAIT; or
  // the turn's queries ran), and over the budget only as Turns allows.
  bool WantInput(const std::shared_ptr<Conn>& c) {
    if (!c->open || c->eof || c->rerun) return false;
    {
      absl::MutexLock l(&c->mu);
      if (c->OutPendingLocked()) return false;
    }
    return c->in.size() - c->in_pos < kMaxUnparsed && turns_.MayRead(c);
  }

  void OnReadable(const std::shared_ptr<Conn>& c) {
    char buf[kReadChunk];
    for (int round = 0; round < 16 && WantInput(c); ++round) {
      int fd;
      {
        absl::MutexLock l(&c->mu);
        fd = c->fd;
      }
      // Peeked, run, then taken: a reply written meanwhile carries the ACK for these bytes. Taken
      // first, a query in two segments (torch's clients send the type byte alone) makes the
      // kernel send a pure ACK at once (the "two pushed segments" rule), an extra packet per op.
      const ssize_t k = recv(fd, buf, sizeof(buf), MSG_PEEK);
      if (k > 0) {
        c->last_input_ns = MonoNs();
        // A query begins (the first one: its deadline runs from its first byte, see CloseIdle).
        if (c->idle_from_ns == 0 || (!c->completed_query && c->in.size() == c->in_pos &&
                                     c->parser.AtBoundary())) {
          c->idle_from_ns = c->last_input_ns;
        }
        c->in.append(buf, static_cast<size_t>(k));
        Pump(c);
        Consume(c, static_cast<size_t>(k));
        if (static_cast<size_t>(k) < sizeof(buf) || c->backlogged) return;
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      c->eof = true;  // closed or reset
      break;
    }
    Pump(c);
  }

  // Drops n peeked bytes from the socket (they are in c->in already).
  void Consume(const std::shared_ptr<Conn>& c, size_t n) {
    absl::MutexLock l(&c->mu);
    while (c->fd >= 0 && n > 0) {
      const ssize_t k = recv(c->fd, nullptr, n, MSG_TRUNC | MSG_DONTWAIT);
      if (k > 0) {
        n -= static_cast<size_t>(k);
      } else if (!(k < 0 && errno == EINTR)) {
        return;  // cannot happen for peeked bytes; a reset shows at the next read
      }
    }
  }

  void Flush(const std::shared_ptr<Conn>& c) {
    absl::MutexLock l(&c->mu);
    c->FlushLocked();
  }

  // Runs the connection's queries as far as its input, its outstanding request and its unsent
  // replies allow; closes it when it failed or the peer left.
  void Pump(const std::shared_ptr<Conn>& c) {
    bool stuck = false;  // on the outstanding request or on unsent replies
    int ran = 0;
    while (c->open) {
      std::string fail;
      bool gone = false;
      {
        absl::MutexLock l(&c->mu);
        if (!c->broken.empty()) {
          fail = c->broken;
        } else if (c->awaiting && c->done) {
          c->awaiting = false;
          c->parked_bytes = 0;
          if (c->refused) {  // a large answer over the budget: run it again later
            c->refused = false;
            c->rerun = true;
          } else if (c->kept != nullptr) {
            c->kept.reset();
            c->kept_bytes = 0;
          }
          // A 2.x WAIT cancelled by CANCEL_WAIT: that query is answered next, whatever this was.
          if (c->done_code != 0 && !c->cancel_requested) {
            if (c->done_code == static_cast<int>(absl::StatusCode::kCancelled)) {
              gone = true;
            } else {
              fail = absl::Status(static_cast<absl::StatusCode>(c->done_code), c->done_message)
                         .ToString();
            }
          }
          c->cancel_requested = false;
        }
        stuck = c->awaiting || c->OutPendingLocked();
      }
      if (!fail.empty()) return Close(c, fail, "failed");
      if (gone) return Close(c, "its request was cancelled", nullptr);
      if (stuck) {
        if (c->awaiting && MaybeCancelWait(c)) continue;
        break;
      }
      if (c->rerun) {
        stuck = true;
        if (!turns_.MayRerun(c)) break;
        c->rerun = false;
        const v1::Request* again = c->kept.get();
        Submit(c, *again, std::move(c->kept), std::move(c->kept_plan), /*turn=*/true);
        continue;
      }
      if (c->in_pos == c->in.size()) break;
      if (ran == kQueriesPerTurn) {  // the others' turn first
        if (!c->backlogged) backlog_.push_back(c);
        c->backlogged = true;
        break;
      }
      if (c->dialect == tcpstore::Dialect::kUnknown) {
        c->dialect = tcpstore::DetectDialect(c->in.data() + c->in_pos, c->in.size() - c->in_pos);
        if (c->dialect == tcpstore::Dialect::kUnknown) break;
      }
      size_t used = 0;
      std::string why;
      const auto r = c->parser.Feed(c->in.data() + c->in_pos, c->in.size() - c->in_pos,
                                    c->dialect == tcpstore::Dialect::kV2, &used, &why);
      c->in_pos += used;
      if (r == tcpstore::QueryParser::Result::kError) return Close(c, why, "malformed");
      if (r == tcpstore::QueryParser::Result::kNeedMore) break;
      why = Run(c, c->parser.query());
      ++ran;
      c->parser.Reset();
      c->completed_query = true;
      // The next query's deadline runs from now if its bytes are here already.
      c->idle_from_ns = c->in_pos < c->in.size() ? MonoNs() : 0;
      if (!why.empty()) return Close(c, why, "refused");
    }
    if (!c->open) return;
    c->SyncHeld();
    if (c->in_pos == c->in.size()) {
      if (c->in.capacity() > 2 * kReadChunk) std::string().swap(c->in);
      c->in.clear();
      c->in_pos = 0;
    } else if (c->in_pos >= kReadChunk) {
      c->in.erase(0, c->in_pos);
      c->in_pos = 0;
    }
    // After the peer closed, what it sent before leaving still runs: a connection waits for the
    // answer to a write (on etcd a cancel could drop it) or for its reply to leave when queries
    // follow it; otherwise (nothing left, half a query, or an outstanding WAIT or GET, which may
    // park for ever with queries queued behind it and the slot held) it closes, and an
    // outstanding request is cancelled.
    if (c->eof) {
      const bool may_park = c->awaiting_op == Op::kWait || c->awaiting_op == Op::kGet ||
                            c->awaiting_op == Op::kMultiGet;
      const bool wait_for_answer = stuck && !(c->awaiting && may_park) && !c->rerun &&
                                   (c->in_pos < c->in.size() || c->awaiting);
      if (!wait_for_answer && !c->backlogged) return Close(c, "", nullptr);
    }
    UpdateInterest(c);
  }

  // A 2.x client whose WAIT timed out sends CANCEL_WAIT: cancel the parked WAIT (the CANCEL_WAIT
  // is then read as the next query and answered). True if it cancelled now.
  bool MaybeCancelWait(const std::shared_ptr<Conn>& c) {
    if (c->dialect != tcpstore::Dialect::kV2 || c->awaiting_op != Op::kWait ||
        c->in_pos >= c->in.size() || static_cast<uint8_t>(c->in[c->in_pos]) != tcpstore::kV2CancelWait) {
      return false;
    }
    {
      absl::MutexLock l(&c->mu);
      if (c->cancel_requested) return false;
      c->cancel_requested = true;
    }
    c->last_cancel_ns = MonoNs();
    cancelling_[c->owner] = {c, c->request_seq};
    backend_->CancelOwner(c->owner);
    return true;
  }

  // Re-cancels requests that were cancelled and not answered yet (every 100 ms, or now with
  // `force`). True while some remain.
  bool RecancelPending(bool force) {
    const int64_t now = MonoNs();
    for (auto it = cancelling_.begin(); it != cancelling_.end();) {
      Conn* c = it->second.first.get();
      bool answered = c->request_seq != it->second.second;  // a later request runs now
      if (!answered) {
        absl::MutexLock l(&c->mu);
        answered = c->done;
      }
      if (answered) {
        it = cancelling_.erase(it);
        continue;
      }
      if (force || now - c->last_cancel_ns >= kRecancelNs) {
        c->last_cancel_ns = now;
        backend_->CancelOwner(it->first);
      }
      ++it;
    }
    return !cancelling_.empty();
  }

  void UpdateInterest(const std::shared_ptr<Conn>& c) {
    bool out_pending;
    {
      absl::MutexLock l(&c->mu);
      out_pending = c->OutPendingLocked();
    }
    const uint32_t want = (WantInput(c) ? EPOLLIN : 0) | (out_pending ? EPOLLOUT : 0);
    if (want == c->events || c->events == kUnregistered) return;
    c->events = want;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = c->owner;
    absl::MutexLock l(&c->mu);
    epoll_ctl(epfd_, EPOLL_CTL_MOD, c->fd, &ev);
  }

  // A peer that leaves a reply unread for write_stall_timeout is closed (it holds the reply).
  void CloseStalledWriters(int64_t now) {
    const int64_t limit = absl::ToInt64Nanoseconds(options_.write_stall_timeout);
    std::vector<std::shared_ptr<Conn>> stalled;
    for (const auto& [owner, c] : conns_) {
      absl::MutexLock l(&c->mu);
      if (c->OutPendingLocked() && now - c->out_progress_ns > limit) stalled.push_back(c);
    }
    for (const auto& c : stalled) {
      Close(c, absl::StrCat("the client read none of its reply for ",
                            absl::FormatDuration(options_.write_stall_timeout),
                            " (write_stall_timeout)"), "stalled");
    }
    if (auto c = turns_.StalledReader(now, limit)) {
      Close(c, absl::StrCat("the client sent none of its query for ",
                            absl::FormatDuration(options_.write_stall_timeout),
                            " while it held the budget's read turn (write_stall_timeout; "
                            "max_buffered_bytes is full)"), "stalled");
    }
  }

  // Whether the listener waits for `c` to send (so that an idle deadline may run): not while a
  // request is outstanding, a reply waits to leave, a refused request waits to run again, its
  // turn's queries wait for the next round, or the budget keeps it from being read.
  bool WaitsForClient(const std::shared_ptr<Conn>& c) {
    if (c->awaiting || c->rerun || c->backlogged || c->read_queued) return false;
    absl::MutexLock l(&c->mu);
    return !c->OutPendingLocked();
  }

  // Closes connections that completed no query within idle_timeout (TcpStoreOptions).
  void CloseIdle(int64_t now) {
    const int64_t limit = absl::ToInt64Nanoseconds(options_.idle_timeout);
    if (limit <= 0) return;
    // torch's TCPStore client opens a second connection at start (its watch_key callback
    // client) that sends nothing until a watch_key, and its background thread ends the process
    // when that connection is closed: a connection that sent nothing at all is closed only while
    // the table is at least half full (silent sockets crowding clients out).
    const bool pressure = conns_.size() * 2 >= options_.max_connections;
    std::vector<std::shared_ptr<Conn>> idle;
    for (const auto& [owner, c] : conns_) {
      if (c->idle_from_ns == 0) continue;
      if (!pressure && !c->completed_query && c->in.empty() && c->parser.AtBoundary()) continue;
      if (!WaitsForClient(c)) {
        c->idle_from_ns = now;  // not the client's time: the deadline restarts once it is
        continue;
      }
      if (now - c->idle_from_ns > limit) idle.push_back(c);
    }
    for (const auto& c : idle) {
      Close(c, absl::StrCat(c->completed_query ? "a client sent part of a query and"
                                               : "a connection sent no query and",
                            " completed none for ", absl::FormatDuration(options_.idle_timeout),
                            " (idle_timeout)"),
            "idle");
    }
  }

  // The connection a full table gives up for a new one: the oldest of those that completed no
  // query yet (silent sockets; a client between queries, even one silent for hours, is a torch
  // rank and keeps its slot); null if there is none.
  std::shared_ptr<Conn> OldestSilent() {
    std::shared_ptr<Conn> best;
    for (const auto& [owner, c] : conns_) {
      if (!c->open || c->completed_query) continue;
      if (best == nullptr || c->last_input_ns < best->last_input_ns) best = c;
    }
    return best;
  }

  // Closes the connection: its outstanding request is cancelled (and cancelled again until it is
  // answered). `why` empty = the client went away. A `warn_kind` makes it a warning, logged at
  // most once a second per kind (WarnLimiter); null = debug.
  void Close(std::shared_ptr<Conn> c, const std::string& why, const char* warn_kind) {
    if (!c->open) return;
    c->open = false;
    if (warn_kind != nullptr && !why.empty()) {
      warnings_.Warn(warn_kind, absl::StrCat("connection closed: ", why));
    } else {
      spdlog::debug("store: TCPStore client went away{}{}", why.empty() ? "" : ": ", why);
    }
    conns_.erase(c->owner);
    bool outstanding;
    {
      absl::MutexLock l(&c->mu);
      epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
      close(c->fd);
      c->fd = -1;
      std::string().swap(c->out);
      c->out_off = 0;
      c->SyncOutLocked();
      outstanding = c->awaiting && !c->done;
    }
    std::string().swap(c->in);
    c->in_pos = 0;
    c->parser.Reset();
    c->kept.reset();
    c->kept_bytes = 0;
    c->parked_bytes = 0;
    c->SyncHeld();
    backend_->CancelOwner(c->owner);
    if (outstanding) {
      c->last_cancel_ns = MonoNs();
      cancelling_[c->owner] = {c, c->request_seq};
    }
  }

  // Runs one parsed query: answered here (VALIDATE, PING, CANCEL_WAIT) or sent to the backend,
  // whose callback writes the reply. Non-empty = why the connection must close.
  std::string Run(const std::shared_ptr<Conn>& c, tcpstore::Query& q) {
    switch (q.op) {
      case Op::kValidate:
        if (q.num != tcpstore::kValidationMagic) {
          return absl::StrCat("TCPStore VALIDATE with magic number ", q.num, ", not torch's ",
                              tcpstore::kValidationMagic, ": not a TCPStore client");
        }
        return "";
      case Op::kPing: {
        const uint32_t nonce = static_cast<uint32_t>(q.num);
        absl::MutexLock l(&c->mu);
        c->WriteLocked(reinterpret_cast<const char*>(&nonce), 4);
        return "";
      }
      case Op::kCancelWait: {  // the wait it cancels already ended (cancelled on arrival)
        const char answer = static_cast<char>(tcpstore::kWaitCanceled);
        absl::MutexLock l(&c->mu);
        c->WriteLocked(&answer, 1);
        return "";
      }
      default: break;
    }
    // Only a request that may run again outlives Execute (Conn::kept): the others live on the
    // stack, which saves a heap allocation per WAIT, ADD, SET... (Execute copies what it keeps).
    tcpstore::ReplyPlan plan;
    std::unique_ptr<v1::Request> keep;
    v1::Request local;
    v1::Request* req = &local;
    if (tcpstore::MayRunAgain(q.op, nullptr)) {
      keep = std::make_unique<v1::Request>();
      req = keep.get();
    }
    if (!tcpstore::BuildRequest(q, options_.key_prefix, req, &plan)) {
      return "internal: unhandled TCPStore query";  // the parser refuses the others
    }
    if (plan.op == Op::kWait) {  // parks in the backend, keys and all: charged to the budget
      const int64_t bytes = static_cast<int64_t>(req->ByteSizeLong());
      if (bytes > static_cast<int64_t>(options_.max_wait_bytes)) {
        return absl::StrCat("a WAIT for ", req->wait().keys_size(), " keys of ", bytes,
                            " bytes, over max_wait_bytes=", options_.max_wait_bytes,
                            " (wait on fewer or shorter keys)");
      }
      if (bytes > static_cast<int64_t>(tcpstore::kSmallQueryBytes) && !budget_->Fits(bytes)) {
        return absl::StrCat("a WAIT of ", bytes, " bytes does not fit the listener's budget (",
                            budget_->held(), " bytes held; max_buffered_bytes=",
                            options_.max_buffered_bytes, ")");
      }
      c->parked_bytes = bytes;
    }
    Submit(c, *req, std::move(keep), std::move(plan), /*turn=*/false);
    return "";
  }

  // Sends `req` to the backend; its callback writes the reply. A request that may run again comes
  // as `keep` (owning `req`) and is kept (Conn::kept); its large answer is refused over the budget
  // unless `turn` (a rerun by the reply turn's holder, Turns) and the connection still holds the
  // turn.
  void Submit(const std::shared_ptr<Conn>& c, const v1::Request& req,
              std::unique_ptr<v1::Request> keep, tcpstore::ReplyPlan plan, bool turn) {
    c->awaiting = true;
    c->awaiting_op = plan.op;
    c->run_ns = MonoNs();
    ++c->request_seq;
    {
      absl::MutexLock l(&c->mu);
      c->done = false;
      c->cancel_requested = false;
      c->refused = false;
    }
    std::shared_ptr<ReadyQueue> ready = ready_;
    ready_->running = c.get();
    if (keep != nullptr) {
      c->kept_bytes = static_cast<int64_t>(keep->ByteSizeLong() + plan.expected.size());
      c->kept_plan = plan;
      c->kept = std::move(keep);
    }
    backend_->Execute({&req}, [c, ready, turn, plan = std::move(plan)](v1::Response r) {
      c->Answer(plan, turn, r);
      ready->Push(c);
    }, c->owner);
    ready_->running = nullptr;
  }

  Backend* const backend_;
  const TcpStoreOptions options_;
  int port_ = 0;
  int listen_fd_ = -1, epfd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread loop_;
  const std::shared_ptr<ReadyQueue> ready_ = std::make_shared<ReadyQueue>();
  const std::shared_ptr<tcpstore::Budget> budget_ =
      std::make_shared<tcpstore::Budget>(static_cast<int64_t>(options_.max_buffered_bytes));
  // Loop thread only (and Shutdown after the join):
  std::map<uint64_t, std::shared_ptr<Conn>> conns_;       // by owner
  std::vector<std::shared_ptr<Conn>> backlog_;            // Conn::backlogged ones
  // Cancelled requests not answered yet: the connection and its request_seq then.
  std::map<uint64_t, std::pair<std::shared_ptr<Conn>, uint64_t>> cancelling_;
  base::RefusalLog refusals_{"store: TCPStore listener"};
  tcpstore::WarnLimiter warnings_;
  base::SpareDescriptor spare_;
  Turns turns_{budget_};
};

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    const std::string& host, int port, Backend* backend, TcpStoreOptions options) {
  auto impl = std::make_unique<Impl>(backend, std::move(options));
  absl::Status s = impl->Listen(host, port);
  if (!s.ok()) return s;
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreServer::~TcpStoreServer() { Shutdown(); }
int TcpStoreServer::port() const { return impl_->port(); }
int64_t TcpStoreServer::buffered_bytes() const { return impl_->buffered_bytes(); }
void TcpStoreServer::Shutdown() { impl_->Shutdown(); }

}  // namespace ember::store
