// ember::store::Client: one pipelined Session stream per connection, reconnected with backoff.
#include "runtime/store/client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "proto/store.grpc.pb.h"
#include "runtime/base/little_endian.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/fast_path_protocol.h"
#include "spdlog/spdlog.h"

namespace ember::store {

using v1::Request;
using v1::Response;

namespace {

bool Idempotent(const Request& r) {
  switch (r.op_case()) {
    case Request::kAdd:
    case Request::kAppend:
    case Request::kCompareSet:
    case Request::kDeletePrefix:
    case Request::kLeaseGrant:
      return false;
    default:
      return true;
  }
}

std::string Describe(const Request& r) {
  switch (r.op_case()) {
    case Request::kSet: return absl::StrCat("Set('", r.set().key(), "')");
    case Request::kGet: return absl::StrCat("Get('", r.get().key(), "')");
    case Request::kAdd: return absl::StrCat("Add('", r.add().key(), "')");
    case Request::kCompareSet: return absl::StrCat("CompareSet('", r.compare_set().key(), "')");
    case Request::kWait: return absl::StrCat("Wait([", absl::StrJoin(r.wait().keys(), ", "), "])");
    case Request::kMultiGet: return absl::StrCat("MultiGet(", r.multi_get().keys_size(), " keys)");
    case Request::kAppend: return absl::StrCat("Append('", r.append().key(), "')");
    default: return "store call";
  }
}

absl::Status ToStatus(const Response& r) {
  if (r.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
}

}  // namespace

// The shared connection: a queue of pending requests and the current stream.
class Connection {
 public:
  using Done = std::function<void(Response)>;

  explicit Connection(ClientOptions options) : options_(std::move(options)) {
    grpc_only_ = !options_.use_fast_path;
    timer_ = std::thread([this] { TimerLoop(); });
  }

  ~Connection() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      if (stream_ != nullptr) stream_->ctx.TryCancel();
      if (fast_fd_ >= 0) shutdown(fast_fd_, SHUT_RDWR);
      auto no_streams = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_streams_ == 0; };
      mu_.Await(absl::Condition(&no_streams));
    }
    timer_.join();
    if (reader_.joinable()) reader_.join();
    {
      absl::MutexLock l(&mu_);
      if (old_fd_ >= 0) close(old_fd_);
    }
    std::vector<std::pair<Done, Response>> fail;
    {
      absl::MutexLock l(&mu_);
      for (auto& [id, p] : pending_) {
        Response r;
        r.set_id(id);
        r.set_code(static_cast<int>(absl::StatusCode::kCancelled));
        r.set_message("store client closed");
        fail.emplace_back(std::move(p.done), std::move(r));
      }
      pending_.clear();
    }
    for (auto& [d, r] : fail) d(std::move(r));
  }

  const ClientOptions& options() const { return options_; }

  // The gRPC stub, created on first use: a client that only uses the fast path never pays for
  // gRPC's channel set-up.
  v1::Store::Stub* stub() {
    absl::MutexLock l(&stub_mu_);
    if (stub_ == nullptr) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
      args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
      args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 256 << 20);
      args.SetInt(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, 256 << 20);
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      // One TCP connection per Connection (not shared through the global subchannel pool).
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto creds =
          options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials();
      channel_ = grpc::CreateCustomChannel(options_.address, creds, args);
      stub_ = v1::Store::NewStub(channel_);
    }
    return stub_.get();
  }

  // Queues `req` (its id is assigned here); `done` runs exactly once on an internal thread (or
  // inline for an immediate failure).
  void Call(Request req, absl::Duration timeout, Done done) {
    bool kick_stream = false;
    {
      absl::MutexLock l(&mu_);
      uint64_t id = ++next_id_;
      req.set_id(id);
      Pending& p = pending_[id];
      p.req = std::move(req);
      p.done = std::move(done);
      p.deadline = absl::Now() + timeout;
      if (p.deadline < timer_wake_at_) kick_ = true;  // the timer sleeps past this deadline
      unsent_.push_back(id);
      kick_stream = stream_ != nullptr || fast_fd_ >= 0;
      if (!kick_stream) kick_ = true;  // wake the timer thread to connect now
    }
    if (kick_stream) Flush();
  }

 private:
  struct Pending {
    Request req;
    Done done;
    absl::Time deadline;
    bool sent = false;
  };

  struct Stream : public grpc::ClientBidiReactor<v1::RequestBatch, v1::ResponseBatch> {
    explicit Stream(Connection* c) : conn(c) {
      if (!c->options_.auth_token.empty()) {
        ctx.AddMetadata("authorization", "Bearer " + c->options_.auth_token);
      }
      c->stub()->async()->Session(&ctx, this);
      StartRead(&in);
      AddHold();  // released when the stream is done writing (OnDone needs no pending writes)
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        // OnDone (which deletes this) may run as soon as the hold goes: release it only when no
        // write is in flight or about to start (Flush checks read_done under the same lock).
        bool release;
        {
          absl::MutexLock l(&conn->mu_);
          read_done = true;
          release = !writing && !hold_released;
          hold_released |= release;
        }
        if (release) RemoveHold();
        return;
      }
      conn->Deliver(&in);
      in.Clear();
      StartRead(&in);
    }
    void OnWriteDone(bool ok) override { conn->WriteDone(this, ok); }
    void OnDone(const grpc::Status& s) override {
      conn->StreamDone(this, s);
      delete this;
    }
    Connection* conn;
    grpc::ClientContext ctx;
    v1::RequestBatch out;
    v1::ResponseBatch in;
    bool writing = false;        // guarded by conn->mu_
    bool read_done = false;      // guarded by conn->mu_: reads ended, no new writes
    bool hold_released = false;  // guarded by conn->mu_
  };

  void Flush() {
    if (FastFlush()) return;
    Stream* s = nullptr;
    {
      absl::MutexLock l(&mu_);
      s = stream_;
      if (s == nullptr || s->writing || s->read_done || unsent_.empty()) return;
      s->out.Clear();
      while (!unsent_.empty()) {
        uint64_t id = unsent_.front();
        unsent_.pop_front();
        auto it = pending_.find(id);
        if (it == pending_.end()) continue;  // timed out before it was sent
        it->second.sent = true;
        *s->out.add_requests() = it->second.req;
      }
      if (s->out.requests_size() == 0) return;
      s->writing = true;
    }
    s->StartWrite(&s->out);
  }

  void WriteDone(Stream* s, bool ok) {
    bool release = false, flush;
    {
      absl::MutexLock l(&mu_);
      s->writing = false;
      if (s->read_done && !s->hold_released) release = s->hold_released = true;
      flush = ok && stream_ == s && !release;
    }
    if (release) s->RemoveHold();  // (s may be deleted from here on)
    if (flush) Flush();
  }

  void Deliver(v1::ResponseBatch* batch) {
    std::vector<std::pair<Done, Response>> ready;
    {
      absl::MutexLock l(&mu_);
      failures_ = 0;
      for (Response& r : *batch->mutable_responses()) {
        auto it = pending_.find(r.id());
        if (it == pending_.end()) continue;  // already timed out locally
        ready.emplace_back(std::move(it->second.done), std::move(r));
        pending_.erase(it);
      }
    }
    for (auto& [d, r] : ready) d(std::move(r));
  }

  void StreamDone(Stream* s, const grpc::Status& status) {
    std::vector<std::pair<Done, Response>> fail;
    {
      absl::MutexLock l(&mu_);
      --live_streams_;
      if (stream_ == s) stream_ = nullptr;
      Broken(static_cast<absl::StatusCode>(status.error_code()), status.error_message(), &fail);
    }
    for (auto& [d, r] : fail) d(std::move(r));
  }

  // The transport broke: re-queue what may be retried, fail the rest, schedule a reconnect.
  void Broken(absl::StatusCode code, const std::string& message,
              std::vector<std::pair<Done, Response>>* fail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool permanent = code == absl::StatusCode::kUnauthenticated ||
                     code == absl::StatusCode::kPermissionDenied ||
                     code == absl::StatusCode::kUnimplemented;
    if (!stop_) {
      ++failures_;
      last_error_ = message;
      if (failures_ == 1 || failures_ % 50 == 0) {
        spdlog::warn("store client: connection to {} ended ({}: {}); reconnecting",
                     options_.address, static_cast<int>(code), message);
      }
    }
    std::deque<uint64_t> resend;
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = it->second;
      bool retry = !permanent && (!p.sent || Idempotent(p.req));
      if (retry) {
        if (p.sent) resend.push_back(it->first);
        p.sent = false;
        ++it;
        continue;
      }
      Response r;
      r.set_id(it->first);
      if (permanent) {
        r.set_code(static_cast<int>(code));
        r.set_message(absl::StrCat("store at ", options_.address, ": ", message));
      } else {
        r.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
        r.set_message(absl::StrCat("connection to store at ", options_.address, " broke while ",
                                   Describe(p.req),
                                   " was in flight; outcome unknown (not retried because it is "
                                   "not idempotent)"));
      }
      fail->emplace_back(std::move(p.done), std::move(r));
      it = pending_.erase(it);
    }
    // Re-sent requests go first, in their original order.
    for (auto it = resend.rbegin(); it != resend.rend(); ++it) unsent_.push_front(*it);
    next_attempt_ = absl::Now() + Backoff();
    kick_ = true;  // let the timer thread re-plan its sleep around next_attempt_
  }

  // --- plain-TCP fast path (fast_path.h) --------------------------------------------------------
  // Sends everything queued over the fast socket. Returns false if the fast path is not connected.
  bool FastFlush() {
    while (true) {
      std::string frame;
      int fd;
      {
        absl::MutexLock l(&mu_);
        if (fast_fd_ < 0) return false;
        if (fast_writing_ || unsent_.empty()) return true;
        fd = fast_fd_;
        // A RequestBatch on the wire is its requests as repeated field 1: encode them directly
        // from the pending entries instead of copying each Request into a batch message.
        frame.assign(4, '\0');
        int n = 0;
        while (!unsent_.empty()) {
          uint64_t id = unsent_.front();
          unsent_.pop_front();
          auto it = pending_.find(id);
          if (it == pending_.end()) continue;
          it->second.sent = true;
          AppendRequestField(it->second.req, &frame);
          ++n;
        }
        if (n == 0) return true;
        fast_writing_ = true;
        const uint32_t len = static_cast<uint32_t>(frame.size() - 4);
        std::string hdr;
        base::AppendU32LE(len, &hdr);
        frame.replace(0, 4, hdr);
      }
      bool ok = SendAll(fd, frame);
      {
        absl::MutexLock l(&mu_);
        fast_writing_ = false;
      }
      if (!ok) {
        shutdown(fd, SHUT_RDWR);  // the reader sees it and handles the break
        return true;
      }
    }
  }

  // Appends `req` as field 1 (length-delimited) of a RequestBatch.
  static void AppendRequestField(const Request& req, std::string* out) {
    const size_t size = req.ByteSizeLong();
    out->push_back(static_cast<char>((1 << 3) | 2));  // field 1, wire type LEN
    size_t v = size;
    while (v >= 0x80) {
      out->push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    out->push_back(static_cast<char>(v));
    const size_t at = out->size();
    out->resize(at + size);
    req.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(&(*out)[at]));
  }

  static bool SendAll(int fd, const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t k = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return false;
      off += static_cast<size_t>(k);
    }
    return true;
  }

  // Reads one frame from a blocking socket (handshake only); false on EOF/error/timeout.
  static bool ReadFrame(int fd, std::string* payload, int timeout_ms) {
    auto read_n = [&](char* dst, size_t n) {
      size_t got = 0;
      while (got < n) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, timeout_ms) <= 0) return false;
        ssize_t k = recv(fd, dst + got, n - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        got += static_cast<size_t>(k);
      }
      return true;
    };
    char hdr[4];
    if (!read_n(hdr, 4)) return false;
    uint32_t len = base::LoadU32LE(hdr);
    if (len > kMaxFastFrameBytes) return false;
    payload->resize(len);
    return read_n(payload->data(), len);
  }

  // --- reading the fast socket: one "reader role" at a time ------------------------------------
  // A synchronous caller reads its own answer when the role is free (no thread hand-off on the
  // hot path); the background reader takes the role only while asynchronous requests are pending.
  enum class ReadResult { kFrame, kNone, kClosed };

  static constexpr int kReadSliceMs = 50;

  // REQUIRES the reader role. Partial frames stay in rbuf_ across calls. Waits at most one read
  // slice (kReadSliceMs) for bytes.
  ReadResult ReadSome(int fd, v1::ResponseBatch* out) {
    while (true) {
      if (rbuf_.size() >= 4) {
        uint32_t len = base::LoadU32LE(rbuf_.data());
        if (len > kMaxFastFrameBytes) return ReadResult::kClosed;
        if (rbuf_.size() >= 4 + size_t{len}) {
          bool ok = out->ParseFromArray(rbuf_.data() + 4, static_cast<int>(len));
          rbuf_.erase(0, 4 + size_t{len});
          return ok ? ReadResult::kFrame : ReadResult::kClosed;
        }
      }
      // The socket has SO_RCVTIMEO = kReadSliceMs (set in DialFast): a blocking recv that gives up
      // after the slice, so the reader re-checks its state without an extra poll() per message.
      char buf[64 << 10];
      ssize_t k = recv(fd, buf, sizeof(buf), 0);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ReadResult::kNone;
      if (k <= 0) return ReadResult::kClosed;
      rbuf_.append(buf, static_cast<size_t>(k));
    }
  }

  // REQUIRES the caller set reader_busy_ for `fd`. Reads and delivers at most one frame, then
  // releases the role; handles a closed connection.
  void ReadAsRole(int fd) {
    v1::ResponseBatch batch;
    ReadResult rr = ReadSome(fd, &batch);
    if (rr == ReadResult::kFrame) Deliver(&batch);
    std::vector<std::pair<Done, Response>> fail;
    {
      absl::MutexLock l(&mu_);
      reader_busy_ = false;
      if (rr == ReadResult::kClosed && fast_fd_ == fd) {
        fast_fd_ = -1;
        rbuf_.clear();
        shutdown(fd, SHUT_RDWR);  // closed when the next connection replaces it
        Broken(absl::StatusCode::kUnavailable, "fast-path connection closed", &fail);
      }
    }
    for (auto& [d, r] : fail) d(std::move(r));
  }

  void ReaderLoop(int fd) {
    while (true) {
      {
        absl::MutexLock l(&mu_);
        auto runnable = [this, fd]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || fast_fd_ != fd ||
                 (!reader_busy_ && static_cast<int>(pending_.size()) > sync_waiters_);
        };
        mu_.Await(absl::Condition(&runnable));
        if (stop_ || fast_fd_ != fd) return;
        reader_busy_ = true;
      }
      ReadAsRole(fd);
    }
  }

 public:
  // Runs one request and waits for its answer on the calling thread.
  Response CallSync(Request req, absl::Duration timeout) {
    struct Slot {
      bool done = false;
      Response resp;
    };
    auto slot = std::make_shared<Slot>();
    {
      absl::MutexLock l(&mu_);
      ++sync_waiters_;
    }
    Call(std::move(req), timeout, [this, slot](Response r) {
      absl::MutexLock l(&mu_);
      slot->resp = std::move(r);
      slot->done = true;
    });
    absl::MutexLock l(&mu_);
    while (!slot->done) {
      if (fast_fd_ >= 0 && !reader_busy_) {
        reader_busy_ = true;
        int fd = fast_fd_;
        mu_.Unlock();
        ReadAsRole(fd);
        mu_.Lock();
        continue;
      }
      auto ready = [this, &slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return slot->done || (fast_fd_ >= 0 && !reader_busy_);
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(50));
    }
    --sync_waiters_;
    return std::move(slot->resp);
  }

 private:
  // Opens a TCP connection to host:port and authenticates. Returns the fd, or an error.
  static bool IsLoopback(const std::string& host) {
    return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
  }

  absl::StatusOr<int> DialFast(int port) {
    std::string host = options_.address.substr(0, options_.address.rfind(':'));
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    int fd = -1;
    if (options_.use_unix_socket && IsLoopback(host)) {
      // Same host: the server's abstract Unix socket, if it has one (else TCP below).
      sockaddr_un ua;
      socklen_t ulen = FastPathUnixAddress(port, &ua);
      fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&ua), ulen) != 0) {
        close(fd);
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
      int rc = fd < 0 ? -1 : connect(fd, res->ai_addr, res->ai_addrlen);
      int err = errno;
      freeaddrinfo(res);
      if (rc != 0) {
        if (fd >= 0) close(fd);
        return absl::UnavailableError(absl::StrCat("connect to store fast path ", host, ":", port,
                                                   ": ", strerror(err)));
      }
    }
    // Keepalive finds a server host that vanished without closing the socket (then reconnect).
    int one = 1, idle = 20, intvl = 5, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    v1::RequestBatch hello;
    hello.set_auth_token(options_.auth_token);
    std::string payload = hello.SerializeAsString(), frame;
    base::AppendU32LE(static_cast<uint32_t>(payload.size()), &frame);
    frame += payload;
    std::string reply;
    v1::ResponseBatch rb;
    if (!SendAll(fd, frame) || !ReadFrame(fd, &reply, 5000) || !rb.ParseFromString(reply)) {
      close(fd);
      return absl::UnavailableError("store fast path closed during the handshake");
    }
    if (rb.responses_size() > 0 && rb.responses(0).code() != 0) {
      close(fd);
      return absl::Status(static_cast<absl::StatusCode>(rb.responses(0).code()),
                          rb.responses(0).message());
    }
    if (rb.responses_size() != 1 || rb.responses(0).message() != kFastPathHello) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("port ", port, " is not an ember-store fast path"));
    }
    timeval slice{0, kReadSliceMs * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof(slice));
    return fd;
  }

  void StartFast(int fd) {
    if (reader_.joinable()) reader_.join();
    {
      absl::MutexLock l(&mu_);
      if (old_fd_ >= 0) close(old_fd_);
      old_fd_ = fd;
      rbuf_.clear();
      fast_fd_ = fd;
      connecting_ = false;
    }
    reader_ = std::thread([this, fd] { ReaderLoop(fd); });
    Flush();
  }

  // One connection attempt (timer thread, mu_ not held): fast path if the server offers it,
  // else the gRPC Session stream.
  void ConnectOnce() {
    std::vector<std::pair<Done, Response>> fail;
    if (!grpc_only_ && !guessed_) {
      guessed_ = true;  // only once: later reconnects ask Info (the port may have moved)
      int grpc_port = std::atoi(options_.address.substr(options_.address.rfind(':') + 1).c_str());
      auto fd = DialFast(grpc_port + 1);
      if (fd.ok()) {
        StartFast(*fd);
        return;
      }
      if (absl::IsUnauthenticated(fd.status())) {
        {
          absl::MutexLock l(&mu_);
          connecting_ = false;
          Broken(fd.status().code(), std::string(fd.status().message()), &fail);
        }
        for (auto& [d, r] : fail) d(std::move(r));
        return;
      }
    }
    if (!grpc_only_) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      if (!options_.auth_token.empty()) {
        ctx.AddMetadata("authorization", "Bearer " + options_.auth_token);
      }
      v1::InfoRequest req;
      v1::InfoResponse info;
      grpc::Status st = stub()->Info(&ctx, req, &info);
      absl::Status err;
      if (st.ok() && info.fast_port() > 0) {
        auto fd = DialFast(info.fast_port());
        if (fd.ok()) {
          StartFast(*fd);
          return;
        }
        err = fd.status();
      } else if (st.ok() || st.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        grpc_only_ = true;  // no fast path offered (TLS, or an older server)
      } else {
        err = absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
      }
      if (!err.ok()) {
        {
          absl::MutexLock l(&mu_);
          connecting_ = false;
          Broken(err.code(), std::string(err.message()), &fail);
        }
        for (auto& [d, r] : fail) d(std::move(r));
        return;
      }
    }
    {
      absl::MutexLock l(&mu_);
      stream_ = new Stream(this);
      ++live_streams_;
      connecting_ = false;
    }
    Flush();
  }

  absl::Duration Backoff() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Duration b = options_.initial_backoff;
    for (int i = 1; i < failures_ && b < options_.max_backoff; ++i) b *= 2;
    b = std::min(b, options_.max_backoff);
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    return b * jitter(rng_);
  }

  void TimerLoop() {
    while (true) {
      std::vector<std::pair<Done, Response>> expired;
      bool start_stream = false;
      {
        absl::MutexLock l(&mu_);
        // Sleep until the earliest deadline or reconnect time (at most 1 s), or a kick: an idle
        // connection costs no wake-ups (thousands of clients may share a host).
        absl::Time wake_at = absl::Now() + absl::Seconds(1);
        for (const auto& [id, p] : pending_) wake_at = std::min(wake_at, p.deadline);
        bool disconnected = stream_ == nullptr && fast_fd_ < 0;
        if (disconnected && !pending_.empty()) wake_at = std::min(wake_at, next_attempt_);
        timer_wake_at_ = wake_at;
        auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || kick_; };
        mu_.AwaitWithDeadline(absl::Condition(&wake), wake_at);
        timer_wake_at_ = absl::InfinitePast();
        kick_ = false;
        if (stop_) return;
        absl::Time now = absl::Now();
        for (auto it = pending_.begin(); it != pending_.end();) {
          if (it->second.deadline > now) {
            ++it;
            continue;
          }
          Response r;
          r.set_id(it->first);
          bool up = stream_ != nullptr || fast_fd_ >= 0;
          r.set_code(static_cast<int>(up ? absl::StatusCode::kDeadlineExceeded
                                         : absl::StatusCode::kUnavailable));
          r.set_message(
              up ? absl::StrCat(Describe(it->second.req), " got no answer from the store at ",
                                     options_.address, " before its deadline")
                      : absl::StrCat("store at ", options_.address, " unreachable; ",
                                     Describe(it->second.req), " gave up at its deadline (last "
                                     "error: ", last_error_, "); is ember-store running?"));
          expired.emplace_back(std::move(it->second.done), std::move(r));
          it = pending_.erase(it);
        }
        if (stream_ == nullptr && fast_fd_ < 0 && !connecting_ && !pending_.empty() &&
            now >= next_attempt_) {
          connecting_ = true;
          start_stream = true;
        }
      }
      for (auto& [d, r] : expired) d(std::move(r));
      if (start_stream) ConnectOnce();
    }
  }

  const ClientOptions options_;
  absl::Mutex stub_mu_;
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(stub_mu_);
  std::unique_ptr<v1::Store::Stub> stub_ ABSL_GUARDED_BY(stub_mu_);
  std::thread timer_;

  absl::Mutex mu_;
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> unsent_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;
  int failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  absl::Time next_attempt_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::mt19937 rng_ ABSL_GUARDED_BY(mu_){std::random_device{}()};
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool kick_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time timer_wake_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool connecting_ ABSL_GUARDED_BY(mu_) = false;
  int fast_fd_ ABSL_GUARDED_BY(mu_) = -1;
  bool fast_writing_ ABSL_GUARDED_BY(mu_) = false;
  bool grpc_only_ = false;  // timer thread only
  bool guessed_ = false;    // timer thread only: tried the gRPC port + 1 already
  bool reader_busy_ ABSL_GUARDED_BY(mu_) = false;  // someone holds the reader role
  int sync_waiters_ ABSL_GUARDED_BY(mu_) = 0;       // callers inside CallSync
  int old_fd_ ABSL_GUARDED_BY(mu_) = -1;            // last fast socket, closed on replacement
  std::string rbuf_;  // bytes read but not yet parsed; only the reader-role holder touches it
  std::thread reader_;      // timer thread starts it; joined there or in the destructor
};

namespace {

// Runs one request synchronously.
absl::StatusOr<Response> RunSync(Connection* conn, Request req, absl::Duration timeout) {
  Response out = conn->CallSync(std::move(req), timeout);
  RETURN_IF_ERROR(ToStatus(out));
  return out;
}

// The server enforces blocking timeouts (and names the keys); the client's own deadline is later.
constexpr absl::Duration kServerSlack = absl::Seconds(5);

int64_t Ms(absl::Duration d) { return std::max<int64_t>(1, absl::ToInt64Milliseconds(d)); }

// A Watch backed by a server-streaming call.
class WatchImpl : public Watch, public grpc::ClientReadReactor<v1::WatchResponse> {
 public:
  WatchImpl(Connection* conn, const v1::WatchRequest& req, std::string strip,
            std::function<void(const WatchEvent&)> on_event,
            std::function<void(absl::Status)> on_end)
      : strip_(std::move(strip)), on_event_(std::move(on_event)), on_end_(std::move(on_end)) {
    if (!conn->options().auth_token.empty()) {
      ctx_.AddMetadata("authorization", "Bearer " + conn->options().auth_token);
    }
    conn->stub()->async()->Watch(&ctx_, &req, this);
    StartRead(&in_);
    StartCall();
  }
  ~WatchImpl() override { Cancel(); }

  void Cancel() override {
    ctx_.TryCancel();
    done_.WaitForNotification();
  }
  absl::Status status() const override {
    absl::MutexLock l(&mu_);
    return status_;
  }

  // Blocks until the server confirmed the watch (its first message) or the stream ended.
  absl::Status WaitStarted(absl::Duration timeout) {
    if (!started_.WaitForNotificationWithTimeout(timeout)) {
      return absl::DeadlineExceededError("the store did not confirm the watch in time");
    }
    return status();
  }

  void OnReadDone(bool ok) override {
    if (!started_.HasBeenNotified()) started_.Notify();
    if (!ok) return;
    for (const auto& ev : in_.events()) {
      WatchEvent e;
      e.type = ev.type() == v1::WatchEvent::DELETE ? WatchEvent::Type::kDelete
                                                     : WatchEvent::Type::kPut;
      e.key = ev.key();
      e.value = ev.value();
      e.revision = ev.revision();
      on_event_(e);
    }
    StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override {
    absl::Status st;
    if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) {
      st = absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    {
      absl::MutexLock l(&mu_);
      status_ = st;
    }
    if (!st.ok() && on_end_) on_end_(st);
    if (!started_.HasBeenNotified()) started_.Notify();
    done_.Notify();
  }

 private:
  std::string strip_;
  std::function<void(const WatchEvent&)> on_event_;
  std::function<void(absl::Status)> on_end_;
  grpc::ClientContext ctx_;
  v1::WatchResponse in_;
  absl::Notification done_;
  absl::Notification started_;
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<Client> Client::Connect(const ClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("store address is empty; pass host:port of ember-store");
  }
  auto conn = std::make_shared<Connection>(options);
  Client c(conn, "");
  // A cheap round trip proves the server is there and accepts our token.
  Request ping;
  ping.mutable_check()->add_keys("__ember_ping__");
  auto r = RunSync(conn.get(), ping, options.connect_timeout);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat("connecting to store at ", options.address, ": ",
                                     r.status().message()));
  }
  return c;
}

Client Client::WithPrefix(absl::string_view prefix) const {
  return Client(conn_, absl::StrCat(prefix_, prefix));
}
const std::string& Client::address() const { return conn_->options().address; }
std::string Client::Full(absl::string_view key) const { return absl::StrCat(prefix_, key); }
absl::Duration Client::Timeout(const CallOptions& o) const {
  return o.timeout > absl::ZeroDuration() ? o.timeout : conn_->options().default_timeout;
}

absl::Status Client::Set(absl::string_view key, absl::string_view value, CallOptions opts) {
  return SetWithLease(key, value, 0, opts);
}

absl::Status Client::SetWithLease(absl::string_view key, absl::string_view value, int64_t lease,
                                  CallOptions opts) {
  Request req;
  req.mutable_set()->set_key(Full(key));
  req.mutable_set()->set_value(std::string(value));
  req.mutable_set()->set_lease_id(lease);
  return RunSync(conn_.get(), std::move(req), Timeout(opts)).status();
}

absl::StatusOr<std::string> Client::Get(absl::string_view key, CallOptions opts) {
  Request req;
  absl::Duration t = Timeout(opts);
  req.mutable_get()->set_key(Full(key));
  req.mutable_get()->set_wait(opts.wait);
  req.mutable_get()->set_timeout_ms(Ms(t));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), t + kServerSlack));
  if (!r.get().found()) return absl::NotFoundError(absl::StrCat("key '", Full(key), "' not found"));
  return std::move(*r.mutable_get()->mutable_value());
}

absl::StatusOr<int64_t> Client::Add(absl::string_view key, int64_t delta, CallOptions opts) {
  Request req;
  req.mutable_add()->set_key(Full(key));
  req.mutable_add()->set_delta(delta);
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.add().value();
}

absl::StatusOr<CompareSetResult> Client::CompareSet(absl::string_view key,
                                                    std::optional<std::string> expected,
                                                    absl::string_view desired, CallOptions opts) {
  Request req;
  auto* q = req.mutable_compare_set();
  q->set_key(Full(key));
  q->set_expect_absent(!expected.has_value());
  if (expected) q->set_expected(*expected);
  q->set_desired(std::string(desired));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return CompareSetResult{r.compare_set().swapped(), r.compare_set().exists(),
                          r.compare_set().current()};
}

absl::Status Client::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  Request req;
  for (const auto& k : keys) req.mutable_wait()->add_keys(Full(k));
  req.mutable_wait()->set_timeout_ms(Ms(timeout));
  return RunSync(conn_.get(), std::move(req), timeout + kServerSlack).status();
}

absl::StatusOr<bool> Client::Check(const std::vector<std::string>& keys, CallOptions opts) {
  Request req;
  for (const auto& k : keys) req.mutable_check()->add_keys(Full(k));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.check().all_exist();
}

absl::StatusOr<bool> Client::Delete(absl::string_view key, CallOptions opts) {
  Request req;
  req.mutable_delete_()->set_key(Full(key));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.delete_().deleted();
}

absl::StatusOr<int64_t> Client::DeletePrefix(absl::string_view prefix, CallOptions opts) {
  Request req;
  req.mutable_delete_prefix()->set_prefix(Full(prefix));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.delete_prefix().deleted();
}

absl::StatusOr<int64_t> Client::NumKeys(absl::string_view prefix, CallOptions opts) {
  Request req;
  req.mutable_num_keys()->set_prefix(Full(prefix));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.num_keys().count();
}

absl::StatusOr<std::vector<std::optional<std::string>>> Client::MultiGet(
    const std::vector<std::string>& keys, CallOptions opts) {
  Request req;
  absl::Duration t = Timeout(opts);
  for (const auto& k : keys) req.mutable_multi_get()->add_keys(Full(k));
  req.mutable_multi_get()->set_wait(opts.wait);
  req.mutable_multi_get()->set_timeout_ms(Ms(t));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), t + kServerSlack));
  std::vector<std::optional<std::string>> out(keys.size());
  const auto& m = r.multi_get();
  for (int i = 0; i < m.found_size() && i < static_cast<int>(out.size()); ++i) {
    if (m.found(i)) out[i] = m.values(i);
  }
  return out;
}

absl::Status Client::MultiSet(const std::vector<std::pair<std::string, std::string>>& kvs,
                              CallOptions opts) {
  Request req;
  for (const auto& [k, v] : kvs) {
    auto* kv = req.mutable_multi_set()->add_kvs();
    kv->set_key(Full(k));
    kv->set_value(v);
  }
  return RunSync(conn_.get(), std::move(req), Timeout(opts)).status();
}

absl::StatusOr<int64_t> Client::Append(absl::string_view key, absl::string_view value,
                                       CallOptions opts) {
  Request req;
  req.mutable_append()->set_key(Full(key));
  req.mutable_append()->set_value(std::string(value));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.append().new_size();
}

absl::StatusOr<std::vector<std::string>> Client::ListKeys(absl::string_view prefix,
                                                          CallOptions opts) {
  Request req;
  req.mutable_list_keys()->set_prefix(Full(prefix));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  std::vector<std::string> out;
  out.reserve(r.list_keys().keys_size());
  for (const auto& k : r.list_keys().keys()) out.push_back(k.substr(prefix_.size()));
  return out;
}

absl::StatusOr<int64_t> Client::GrantLease(absl::Duration ttl, CallOptions opts) {
  Request req;
  req.mutable_lease_grant()->set_ttl_ms(Ms(ttl));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.lease_grant().lease_id();
}

absl::Status Client::RefreshLease(int64_t lease_id, CallOptions opts) {
  Request req;
  req.mutable_lease_refresh()->set_lease_id(lease_id);
  return RunSync(conn_.get(), std::move(req), Timeout(opts)).status();
}

absl::Status Client::RevokeLease(int64_t lease_id, CallOptions opts) {
  Request req;
  req.mutable_lease_revoke()->set_lease_id(lease_id);
  return RunSync(conn_.get(), std::move(req), Timeout(opts)).status();
}

absl::StatusOr<std::unique_ptr<Watch>> Client::WatchPrefix(
    absl::string_view prefix, std::function<void(const WatchEvent&)> on_event, bool send_initial,
    std::function<void(absl::Status)> on_end) {
  v1::WatchRequest req;
  req.set_prefix(Full(prefix));
  req.set_send_initial(send_initial);
  auto w = std::make_unique<WatchImpl>(conn_.get(), req, prefix_, std::move(on_event),
                                       std::move(on_end));
  RETURN_IF_ERROR(w->WaitStarted(conn_->options().connect_timeout));
  return std::unique_ptr<Watch>(std::move(w));
}

absl::Status Client::Barrier(absl::string_view key, int n, absl::Duration timeout) {
  std::string arrived = absl::StrCat(key, "/arrived");
  std::string done = absl::StrCat(key, "/done");
  ASSIGN_OR_RETURN(int64_t count, Add(arrived, 1, {.timeout = timeout}));
  if (count == n) RETURN_IF_ERROR(Set(done, "1", {.timeout = timeout}));
  absl::Status s = Wait({done}, timeout);
  if (absl::IsDeadlineExceeded(s)) {
    auto now = Add(arrived, 0, {.timeout = absl::Seconds(5)});
    return absl::DeadlineExceededError(absl::StrCat(
        "barrier '", Full(key), "': only ", now.ok() ? absl::StrCat(*now) : "?", " of ", n,
        " participants arrived within ", absl::FormatDuration(timeout)));
  }
  return s;
}

void Client::SetAsync(absl::string_view key, absl::string_view value,
                      std::function<void(absl::Status)> done, CallOptions opts) {
  Request req;
  req.mutable_set()->set_key(Full(key));
  req.mutable_set()->set_value(std::string(value));
  conn_->Call(std::move(req), Timeout(opts),
              [done = std::move(done)](Response r) { done(ToStatus(r)); });
}

void Client::GetAsync(absl::string_view key,
                      std::function<void(absl::StatusOr<std::string>)> done, CallOptions opts) {
  Request req;
  absl::Duration t = Timeout(opts);
  std::string full = Full(key);
  req.mutable_get()->set_key(full);
  req.mutable_get()->set_wait(opts.wait);
  req.mutable_get()->set_timeout_ms(Ms(t));
  conn_->Call(std::move(req), t + kServerSlack, [done = std::move(done), full](Response r) {
    absl::Status s = ToStatus(r);
    if (!s.ok()) return done(s);
    if (!r.get().found()) return done(absl::NotFoundError(absl::StrCat("key '", full, "' not found")));
    done(std::move(*r.mutable_get()->mutable_value()));
  });
}

}  // namespace ember::store
