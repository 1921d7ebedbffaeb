// ember::store::Client: one pipelined Session stream per connection, reconnected with backoff.
#include "runtime/store/client.h"

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
#include "runtime/base/status_macros.h"
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
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 256 << 20);
    args.SetInt(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, 256 << 20);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
    // One TCP connection per Connection (not shared through the global subchannel pool).
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto creds = options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials();
    channel_ = grpc::CreateCustomChannel(options_.address, creds, args);
    stub_ = v1::Store::NewStub(channel_);
    timer_ = std::thread([this] { TimerLoop(); });
  }

  ~Connection() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      if (stream_ != nullptr) stream_->ctx.TryCancel();
      auto no_streams = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_streams_ == 0; };
      mu_.Await(absl::Condition(&no_streams));
    }
    timer_.join();
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
  v1::Store::Stub* stub() { return stub_.get(); }

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
      unsent_.push_back(id);
      kick_stream = stream_ != nullptr;
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
      c->stub_->async()->Session(&ctx, this);
      StartRead(&in);
      AddHold();  // released when the stream is done writing (OnDone needs no pending writes)
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        RemoveHold();
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
    bool writing = false;  // guarded by conn->mu_
  };

  void Flush() {
    Stream* s = nullptr;
    {
      absl::MutexLock l(&mu_);
      s = stream_;
      if (s == nullptr || s->writing || unsent_.empty()) return;
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
    {
      absl::MutexLock l(&mu_);
      s->writing = false;
      if (!ok || stream_ != s) return;
    }
    Flush();
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
      bool permanent = status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                       status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                       status.error_code() == grpc::StatusCode::UNIMPLEMENTED;
      if (!stop_) {
        ++failures_;
        last_error_ = status.error_message();
        if (failures_ == 1 || failures_ % 50 == 0) {
          spdlog::warn("store client: stream to {} ended ({}: {}); reconnecting",
                       options_.address, static_cast<int>(status.error_code()),
                       status.error_message());
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
          r.set_code(static_cast<int>(status.error_code()));
          r.set_message(absl::StrCat("store at ", options_.address, ": ", status.error_message()));
        } else {
          r.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
          r.set_message(absl::StrCat("connection to store at ", options_.address,
                                     " broke while ", Describe(p.req),
                                     " was in flight; outcome unknown (not retried because it is "
                                     "not idempotent)"));
        }
        fail.emplace_back(std::move(p.done), std::move(r));
        it = pending_.erase(it);
      }
      // Re-sent requests go first, in their original order.
      for (auto it = resend.rbegin(); it != resend.rend(); ++it) unsent_.push_front(*it);
      next_attempt_ = absl::Now() + Backoff();
    }
    for (auto& [d, r] : fail) d(std::move(r));
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
        mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(5));
        if (stop_) return;
        absl::Time now = absl::Now();
        for (auto it = pending_.begin(); it != pending_.end();) {
          if (it->second.deadline > now) {
            ++it;
            continue;
          }
          Response r;
          r.set_id(it->first);
          r.set_code(static_cast<int>(stream_ ? absl::StatusCode::kDeadlineExceeded
                                              : absl::StatusCode::kUnavailable));
          r.set_message(
              stream_ ? absl::StrCat(Describe(it->second.req), " got no answer from the store at ",
                                     options_.address, " before its deadline")
                      : absl::StrCat("store at ", options_.address, " unreachable; ",
                                     Describe(it->second.req), " gave up at its deadline (last "
                                     "error: ", last_error_, "); is ember-store running?"));
          expired.emplace_back(std::move(it->second.done), std::move(r));
          it = pending_.erase(it);
        }
        if (stream_ == nullptr && !pending_.empty() && now >= next_attempt_) {
          stream_ = new Stream(this);
          ++live_streams_;
          start_stream = true;
        }
      }
      for (auto& [d, r] : expired) d(std::move(r));
      if (start_stream) Flush();
    }
  }

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Store::Stub> stub_;
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
};

namespace {

// Runs one request synchronously.
absl::StatusOr<Response> RunSync(Connection* conn, Request req, absl::Duration timeout) {
  absl::Notification done;
  Response out;
  conn->Call(std::move(req), timeout, [&](Response r) {
    out = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
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

  void OnReadDone(bool ok) override {
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
    done_.Notify();
  }

 private:
  std::string strip_;
  std::function<void(const WatchEvent&)> on_event_;
  std::function<void(absl::Status)> on_end_;
  grpc::ClientContext ctx_;
  v1::WatchResponse in_;
  absl::Notification done_;
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
  return std::unique_ptr<Watch>(
      new WatchImpl(conn_.get(), req, prefix_, std::move(on_event), std::move(on_end)));
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
