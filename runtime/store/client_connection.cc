// The store client's shared connection (see client_connection.h).
#include "runtime/store/client_connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/wire_probe.h"
#include "runtime/store/client_fast.h"
#include "runtime/store/client_retry.h"
#include "spdlog/spdlog.h"

namespace ember::store {

using client_internal::Fired;
using v1::Request;
using v1::Response;

namespace {
void Run(Fired* fired) {
  for (auto& [d, r] : *fired) d(std::move(r));
}
}  // namespace

Connection::Connection(ClientOptions options) : options_(std::move(options)) {
  // The fast path is plaintext: a client with credentials (TLS) never uses it.
  grpc_only_ = !options_.use_fast_path || options_.credentials != nullptr;
  timer_ = std::thread([this] { TimerLoop(); });
  dialer_ = std::thread([this] { DialerLoop(); });
}

Connection::~Connection() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    if (stream_ != nullptr) stream_->Cancel();
    if (fast_fd_ >= 0) shutdown(fast_fd_, SHUT_RDWR);
    if (info_ctx_ != nullptr) info_ctx_->TryCancel();  // a dial in progress ends now
  }
  dial_cancel_.Cancel();
  dialer_.join();  // no stream is started after this
  {
    absl::MutexLock l(&mu_);
    auto no_streams = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_streams_ == 0; };
    mu_.Await(absl::Condition(&no_streams));
  }
  timer_.join();
  if (reader_.joinable()) reader_.join();
  {
    absl::MutexLock l(&mu_);
    if (old_fd_ >= 0) close(old_fd_);
  }
  Fired fail;
  {
    absl::MutexLock l(&mu_);
    queue_.CancelAll(&fail);
  }
  Run(&fail);
}

v1::Store::Stub* Connection::stub() {
  absl::MutexLock l(&stub_mu_);
  if (stub_ == nullptr) stub_ = client_internal::NewStub(options_, &channel_);
  return stub_.get();
}

void Connection::Call(Request req, absl::Duration timeout, Done done, bool caller_reads,
                      bool send) {
  bool kick_stream = false;
  if (!options_.fence_key.empty()) {  // the server checks it on writes only
    req.mutable_fence()->set_key(options_.fence_key);
    req.mutable_fence()->set_epoch(options_.fence_epoch);
  }
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = absl::Now();
    queue_.Push(std::move(req), std::move(done), now, timeout, caller_reads);
    // The timer sleeps past this deadline (timeout + kServerSlack at most).
    if (now + timeout + client_internal::kServerSlack < timer_wake_at_) kick_ = true;
    kick_stream = connected();
    if (!kick_stream) kick_ = true;  // wake the timer thread to connect now
  }
  if (kick_stream && send) Flush();
}

void Connection::Flush() {
  if (FastFlush()) return;
  GrpcFlush();
}

Response Connection::CallSync(Request req, absl::Duration timeout) {
  struct Slot {
    bool done = false;
    Response resp;
  };
  auto slot = std::make_shared<Slot>();
  Call(std::move(req), timeout, [this, slot](Response r) {
    absl::MutexLock l(&mu_);
    slot->resp = std::move(r);
    slot->done = true;
  }, /*caller_reads=*/true);
  absl::MutexLock l(&mu_);
  AwaitReading([&slot] { return slot->done; });
  return std::move(slot->resp);
}

template <typename F>
void Connection::AwaitReading(F done) {
  while (!done()) {
    if (fast_fd_ >= 0 && !reader_busy_) {
      reader_busy_ = true;
      int fd = fast_fd_;
      mu_.Unlock();
      ReadAsRole(fd);
      mu_.Lock();
      continue;
    }
    auto ready = [this, &done]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return done() || (fast_fd_ >= 0 && !reader_busy_);
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(50));
  }
}

// --- Pipeline groups -----------------------------------------------------------------------------
void Connection::CallInGroup(const std::shared_ptr<Pipeline::Group>& g, Request req,
                             absl::Duration timeout, std::function<absl::Status(Response)> done) {
  {
    absl::MutexLock l(&mu_);
    ++g->in_flight;
  }
  Call(std::move(req), timeout,
       [this, g, done = std::move(done)](Response r) {
         absl::Status s = done(std::move(r));
         absl::MutexLock l(&mu_);
         if (!s.ok() && g->first_error.ok()) g->first_error = std::move(s);
         --g->in_flight;
       },
       /*caller_reads=*/true, /*send=*/false);
}

void Connection::AwaitRoom(Pipeline::Group* g, int window) {
  {
    absl::MutexLock l(&mu_);
    if (g->in_flight < window) return;
  }
  Flush();
  absl::MutexLock l(&mu_);
  AwaitReading([g, window] { return g->in_flight < window; });
}

absl::Status Connection::DrainGroup(Pipeline::Group* g) {
  Flush();
  absl::MutexLock l(&mu_);
  AwaitReading([g] { return g->in_flight == 0; });
  return std::exchange(g->first_error, absl::OkStatus());
}

// --- gRPC Session stream -------------------------------------------------------------------------
void Connection::GrpcFlush() {
  client_internal::SessionStream* s = nullptr;
  {
    absl::MutexLock l(&mu_);
    s = stream_;
    if (s == nullptr || s->writing || s->read_ended || !queue_.has_unsent()) return;
    s->out.Clear();
    if (queue_.TakeUnsent(absl::Now(),
                          [s](const Request& r) { *s->out.add_requests() = r; }) == 0) {
      return;
    }
    s->writing = true;
  }
  s->StartWrite(&s->out);
}

bool Connection::OnReadEnded(client_internal::SessionStream* s) {
  absl::MutexLock l(&mu_);
  s->read_ended = true;
  if (!s->writing) return true;
  // A write is being started or is in flight: OnWriteDone releases the hold, so the stream
  // (deleted in OnDone, which the hold defers) outlives GrpcFlush's StartWrite.
  s->hold_after_write = true;
  return false;
}

void Connection::OnWriteDone(client_internal::SessionStream* s, bool ok) {
  bool release = false;
  {
    absl::MutexLock l(&mu_);
    s->writing = false;
    release = s->hold_after_write;
    s->hold_after_write = false;
    ok = ok && !release && stream_ == s;
  }
  if (release) s->ReleaseWriteHold();  // the stream may be deleted from here on
  if (ok) Flush();
}

void Connection::OnBatch(client_internal::SessionStream* s, v1::ResponseBatch* batch) {
  Fired ready;
  {
    absl::MutexLock l(&mu_);
    if (stream_ == s) Deliver(batch, &ready);  // else a dropped stream's late answers
  }
  Run(&ready);
}

void Connection::OnStreamDone(client_internal::SessionStream* s, const grpc::Status& status) {
  Fired fail;
  {
    absl::MutexLock l(&mu_);
    if (stream_ == s) {  // else DropSilent already replaced it
      stream_ = nullptr;
      Broken(static_cast<absl::StatusCode>(status.error_code()), status.error_message(), &fail);
    }
  }
  Run(&fail);
}

void Connection::OnStreamReleased() {
  absl::MutexLock l(&mu_);
  --live_streams_;  // ~Connection (and with it the channel) waits for this
}

// --- fast-path socket ----------------------------------------------------------------------------
bool Connection::FastFlush() {
  while (true) {
    std::string frame;
    int fd;
    {
      absl::MutexLock l(&mu_);
      if (fast_fd_ < 0) return false;
      if (fast_writing_ || !queue_.has_unsent()) return true;
      fd = fast_fd_;
      // Encode the requests straight from the queue instead of copying each into a batch message.
      client_internal::BeginFrame(&frame);
      const int n = queue_.TakeUnsent(absl::Now(), [&frame](const Request& r) {
        client_internal::AppendRequestField(r, &frame);
      });
      if (n == 0) return true;
      fast_writing_ = true;
      client_internal::EndFrame(&frame);
    }
    // Blocks while the socket's buffer is full; DropSilent's shutdown ends that at a deadline.
    bool ok = client_internal::SendAll(fd, frame);
    {
      absl::MutexLock l(&mu_);
      // The reader sees the shutdown and handles the break. (While fast_writing_ is set, `fd` is
      // not closed: StartFast waits for it.)
      if (!ok) shutdown(fd, SHUT_RDWR);
      fast_writing_ = false;
    }
    if (!ok) return true;
  }
}

void Connection::ReadAsRole(int fd) {
  using Result = client_internal::FrameReader::Result;
  v1::ResponseBatch batch;
  const Result rr = frames_.ReadSome(fd, &batch);
  if (rr == Result::kFrame) {
    Fired ready;
    {
      absl::MutexLock l(&mu_);
      // A socket DropSilent replaced: its late answers are discarded.
      if (fast_fd_ == fd) Deliver(&batch, &ready);
    }
    Run(&ready);  // still holding the role: a pipeline's callbacks run in its answers' order
  }
  Fired fail;
  {
    absl::MutexLock l(&mu_);
    reader_busy_ = false;
    if (rr == Result::kClosed && fast_fd_ == fd) {
      fast_fd_ = -1;
      frames_.Clear();
      shutdown(fd, SHUT_RDWR);  // closed when the next connection replaces it
      Broken(absl::StatusCode::kUnavailable, "fast-path connection closed", &fail);
    }
  }
  Run(&fail);
}

void Connection::ReaderLoop(int fd) {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      auto runnable = [this, fd]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || fast_fd_ != fd ||
               (!reader_busy_ && static_cast<int>(queue_.size()) > queue_.owned());
      };
      mu_.Await(absl::Condition(&runnable));
      if (stop_ || fast_fd_ != fd) return;
      reader_busy_ = true;
    }
    ReadAsRole(fd);
  }
}

void Connection::StartFast(int fd) {
  if (reader_.joinable()) reader_.join();
  {
    absl::MutexLock l(&mu_);
    // Nobody may still read or write the old socket (after DropSilent, its reader or writer is
    // just waking from the shutdown) when it is closed and frames_ cleared.
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !reader_busy_ && !fast_writing_;
    };
    mu_.Await(absl::Condition(&idle));
    if (stop_) {
      close(fd);
      connecting_ = false;
      return;
    }
    if (old_fd_ >= 0) close(old_fd_);
    old_fd_ = fd;
    frames_.Clear();
    fast_fd_ = fd;
    last_rx_ = absl::Now();
    connecting_ = false;
  }
  reader_ = std::thread([this, fd] { ReaderLoop(fd); });
  Flush();
}

// --- connecting, breaks, deadlines ---------------------------------------------------------------
void Connection::Deliver(v1::ResponseBatch* batch, Fired* ready) {
  failures_ = 0;
  last_rx_ = absl::Now();
  queue_.Answer(batch, ready);
}

void Connection::DropSilent(const std::string& why, Fired* fail) {
  spdlog::warn("store client: {}; dropping that connection and dialling a fresh one", why);
  if (fast_fd_ >= 0) {
    shutdown(fast_fd_, SHUT_RDWR);  // wakes a reader or writer on it; StartFast closes it
    fast_fd_ = -1;
  }
  if (stream_ != nullptr) {
    stream_->Cancel();  // OnStreamDone finds it replaced
    stream_ = nullptr;
  }
  Broken(absl::StatusCode::kUnavailable, why, fail);
}

void Connection::Broken(absl::StatusCode code, const std::string& message, Fired* fail) {
  if (!stop_) {
    ++failures_;
    last_error_ = message;
    if (failures_ == 1 || failures_ % 50 == 0) {
      spdlog::warn("store client: connection to {} ended ({}: {}); reconnecting",
                   options_.address, static_cast<int>(code), message);
    }
  }
  queue_.Broken(code, message, options_.address, fail);
  next_attempt_ = absl::Now() + client_internal::Backoff(options_, failures_, &rng_);
  kick_ = true;  // let the timer thread re-plan its sleep around next_attempt_
}

void Connection::AttemptFailed(const absl::Status& error) {
  Fired fail;
  {
    absl::MutexLock l(&mu_);
    connecting_ = false;
    Broken(error.code(), std::string(error.message()), &fail);
  }
  Run(&fail);
}

void Connection::ConnectOnce() {
  Fired fail;
  if (TlsMismatch(&fail)) {
    Run(&fail);
    return;
  }
  if (!grpc_only_ && !guessed_) {
    guessed_ = true;  // only once: later reconnects ask Info (the port may have moved)
    int grpc_port = std::atoi(options_.address.substr(options_.address.rfind(':') + 1).c_str());
    auto fd = client_internal::DialFastPath(options_, grpc_port + 1, &dial_cancel_);
    if (fd.ok()) {
      StartFast(*fd);
      return;
    }
    if (absl::IsUnauthenticated(fd.status())) {
      AttemptFailed(fd.status());
      return;
    }
  }
  if (!grpc_only_) {
    v1::InfoResponse info;
    v1::Store::Stub* info_stub = stub();
    grpc::ClientContext ctx;
    {
      absl::MutexLock l(&mu_);
      if (stop_) {
        connecting_ = false;
        return;
      }
      info_ctx_ = &ctx;
    }
    grpc::Status st = client_internal::QueryInfo(info_stub, options_, &ctx, &info);
    {
      absl::MutexLock l(&mu_);
      info_ctx_ = nullptr;
    }
    absl::Status err;
    if (st.ok() && info.fast_port() > 0) {
      auto fd = client_internal::DialFastPath(options_, info.fast_port(), &dial_cancel_);
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
      AttemptFailed(err);
      return;
    }
  }
  v1::Store::Stub* grpc_stub = stub();
  {
    absl::MutexLock l(&mu_);
    connecting_ = false;
    if (stop_) return;
    stream_ = new client_internal::SessionStream(this, grpc_stub, options_.auth_token);
    ++live_streams_;
    last_rx_ = absl::Now();
  }
  Flush();
}

bool Connection::TlsMismatch(Fired* fail) {
  {
    absl::MutexLock l(&mu_);
    if (failures_ == 0 || (failures_ & (failures_ - 1)) != 0) return false;
  }
  base::TlsDiagnosis d = base::DiagnoseTls(base::ProbeWireProtocol(options_.address),
                                           options_.credentials != nullptr);
  absl::MutexLock l(&mu_);
  if (!d.mismatch) {
    tls_hint_ = d.text.empty() ? "" : absl::StrCat("; ", d.text);
    return false;
  }
  connecting_ = false;
  Broken(absl::StatusCode::kFailedPrecondition, d.text, fail);
  return true;
}

void Connection::TimerLoop() {
  while (true) {
    Fired expired;
    {
      absl::MutexLock l(&mu_);
      // Sleep until the earliest deadline or reconnect time (at most 1 s), or a kick: an idle
      // connection costs no wake-ups (thousands of clients may share a host).
      absl::Time wake_at = queue_.EarliestDeadline(absl::Now() + absl::Seconds(1));
      if (!connected() && !connecting_ && !queue_.empty()) {
        wake_at = std::min(wake_at, next_attempt_);
      }
      timer_wake_at_ = wake_at;
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || kick_; };
      mu_.AwaitWithDeadline(absl::Condition(&wake), wake_at);
      timer_wake_at_ = absl::InfinitePast();
      kick_ = false;
      if (stop_) return;
      absl::Time now = absl::Now();
      const std::string last_error =
          last_error_.empty() ? absl::StrCat("none yet; the first connection attempt (dial_timeout ",
                                             absl::FormatDuration(options_.dial_timeout),
                                             ") has not finished")
                              : last_error_;
      const bool silent = queue_.Expire(now, connected(), options_.address,
                                        last_error + tls_hint_, last_rx_, &expired);
      if (silent) {
        DropSilent(absl::StrCat("the store at ", options_.address, " sent nothing back for ",
                                absl::FormatDuration(now - last_rx_),
                                " while a request waited past its deadline"),
                   &expired);
      }
      if (!connected() && !connecting_ && !queue_.empty() && now >= next_attempt_) {
        connecting_ = true;
        dial_wanted_ = true;  // the dialer thread makes the attempt: no deadline waits on a dial
      }
    }
    Run(&expired);
  }
}

void Connection::DialerLoop() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      auto wanted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || dial_wanted_; };
      mu_.Await(absl::Condition(&wanted));
      if (stop_) {
        connecting_ = false;
        return;
      }
      dial_wanted_ = false;
    }
    ConnectOnce();
  }
}

}  // namespace ember::store
