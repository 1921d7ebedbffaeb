// The Store gRPC service (callback API): unary RPCs, the pipelined Session stream and Watch.
// No call holds a thread while it waits: blocking requests are parked in the Backend.
#include "runtime/store/server.h"

#include <atomic>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "proto/store.grpc.pb.h"
#include "runtime/base/grpc_server.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/fast_path.h"
#include "spdlog/spdlog.h"

namespace ember::store {
namespace {

using v1::Request;
using v1::Response;

grpc::Status ResponseStatus(const Response& r) {
  if (r.code() == 0) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(r.code()), r.message());
}

// Constant-time comparison of the presented token with the expected one.
bool TokenMatches(const std::string& expected, grpc::string_ref presented) {
  return base::ConstantTimeEquals("Bearer " + expected,
                                  absl::string_view(presented.data(), presented.size()));
}

// ---------------------------------------------------------------------------------------------
// Session: a bidirectional stream of request/response batches.
// Answers go out in messages of at most `max_message` bytes; more than `max_unsent` bytes of
// answers waiting for a client that stopped reading end the call with RESOURCE_EXHAUSTED.
class SessionReactor : public grpc::ServerBidiReactor<v1::RequestBatch, v1::ResponseBatch> {
 public:
  SessionReactor(Backend* backend, uint64_t owner, int64_t max_message, int64_t max_unsent)
      : backend_(backend), owner_(owner) {
    state_ = std::make_shared<State>();
    state_->reactor = this;
    state_->max_message = max_message;
    state_->max_unsent = max_unsent;
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      {
        absl::MutexLock l(&state_->mu);
        state_->read_closed = true;
      }
      backend_->CancelOwner(owner_);
      Flush(state_);
      return;
    }
    std::vector<const Request*> reqs;
    reqs.reserve(in_.requests_size());
    for (const Request& r : in_.requests()) reqs.push_back(&r);
    {
      absl::MutexLock l(&state_->mu);
      state_->batching = true;  // coalesce the immediate answers of this batch into one write
    }
    std::shared_ptr<State> st = state_;
    backend_->Execute(
        reqs,
        [st](Response r) {
          {
            absl::MutexLock l(&st->mu);
            int64_t bytes = static_cast<int64_t>(r.ByteSizeLong()) + 8;
            if (st->overflow) return;
            st->queued_bytes += bytes;
            if (st->queued_bytes > st->max_unsent) {
              st->overflow = true;
              st->queue.clear();
              st->queued_bytes = 0;
            } else {
              st->queue.emplace_back(std::move(r), bytes);
            }
          }
          Flush(st);
        },
        owner_);
    {
      absl::MutexLock l(&state_->mu);
      state_->batching = false;
    }
    Flush(state_);
    in_.Clear();
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock l(&state_->mu);
      state_->writing = false;
      if (!ok) {
        state_->broken = true;
        state_->queue.clear();
      }
    }
    Flush(state_);
  }

  void OnDone() override {
    {
      absl::MutexLock l(&state_->mu);
      state_->reactor = nullptr;
    }
    backend_->CancelOwner(owner_);
    delete this;
  }

 private:
  struct State {
    absl::Mutex mu;
    SessionReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    std::deque<std::pair<Response, int64_t>> queue ABSL_GUARDED_BY(mu);  // with its size
    int64_t queued_bytes ABSL_GUARDED_BY(mu) = 0;
    int64_t max_message = 0, max_unsent = 0;  // constant after construction
    bool overflow ABSL_GUARDED_BY(mu) = false;
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool batching ABSL_GUARDED_BY(mu) = false;
    bool read_closed ABSL_GUARDED_BY(mu) = false;
    bool broken ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
  };

  // Starts a write of everything queued, or finishes the call once reads ended and all is written.
  static void Flush(const std::shared_ptr<State>& st) {
    SessionReactor* r = nullptr;
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock l(&st->mu);
      if (st->reactor == nullptr || st->finished) return;
      // Overflow finishes even while a write is stuck: the client that stopped reading gets the
      // status after the answers already in flight, and nothing more is buffered for it.
      if (!st->overflow && st->writing) return;
      if (st->broken) st->queue.clear();
      if (st->overflow) {
        r = st->reactor;
        st->finished = true;
        finish = true;
        status = grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("more than ", st->max_unsent, " bytes of answers were waiting for this "
                         "client to read them (max_unsent_bytes_per_stream); the session is closed"));
        spdlog::warn("store: closing a session: {}", status.error_message());
      } else if (!st->queue.empty() && !st->batching) {
        r = st->reactor;
        r->out_.Clear();
        int64_t bytes = 0;
        while (!st->queue.empty()) {
          auto& [resp, size] = st->queue.front();
          if (r->out_.responses_size() > 0 && bytes + size > st->max_message) break;
          bytes += size;
          *r->out_.add_responses() = std::move(resp);
          st->queue.pop_front();
        }
        st->queued_bytes -= bytes;
        st->writing = true;
      } else if (st->read_closed && st->queue.empty()) {
        r = st->reactor;
        st->finished = true;
        finish = true;
      }
    }
    if (r == nullptr) return;
    if (finish) {
      r->Finish(status);
    } else {
      r->StartWrite(&r->out_);
    }
  }

  Backend* const backend_;
  const uint64_t owner_;
  std::shared_ptr<State> state_;
  v1::RequestBatch in_;
  v1::ResponseBatch out_;
};

// ---------------------------------------------------------------------------------------------
// Watch: streams change events under a prefix, coalescing queued events into one message.
class WatchReactor : public grpc::ServerWriteReactor<v1::WatchResponse> {
 public:
  static constexpr size_t kMaxQueuedEvents = 1 << 20;

  // Events not yet written are bounded by count and by `max_unsent` bytes.
  WatchReactor(Backend* backend, const v1::WatchRequest& req, int64_t max_message,
               int64_t max_unsent)
      : backend_(backend) {
    state_ = std::make_shared<State>();
    state_->reactor = this;
    state_->max_message = max_message;
    state_->max_unsent = max_unsent;
    std::shared_ptr<State> st = state_;
    watch_id_ = backend_->AddWatch(req.prefix(), req.send_initial(),
                                   [st](const v1::WatchEvent& ev) {
                                     {
                                       absl::MutexLock l(&st->mu);
                                       int64_t bytes = static_cast<int64_t>(ev.ByteSizeLong()) + 8;
                                       if (st->queue.size() >= kMaxQueuedEvents ||
                                           st->queued_bytes + bytes > st->max_unsent) {
                                         st->overflow = true;
                                       } else if (!st->overflow) {
                                         st->queue.emplace_back(ev, bytes);
                                         st->queued_bytes += bytes;
                                       }
                                     }
                                     Flush(st);
                                   });
    {
      absl::MutexLock l(&state_->mu);
      state_->send_header = true;  // the first message confirms the watch is registered
    }
    Flush(state_);
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock l(&state_->mu);
      state_->writing = false;
      if (!ok) state_->cancelled = true;
    }
    Flush(state_);
  }

  void OnCancel() override {
    {
      absl::MutexLock l(&state_->mu);
      state_->cancelled = true;
    }
    Flush(state_);
  }

  void OnDone() override {
    backend_->RemoveWatch(watch_id_);
    {
      absl::MutexLock l(&state_->mu);
      state_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct State {
    absl::Mutex mu;
    WatchReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    std::deque<std::pair<v1::WatchEvent, int64_t>> queue ABSL_GUARDED_BY(mu);  // with its size
    int64_t queued_bytes ABSL_GUARDED_BY(mu) = 0;
    int64_t max_message = 0, max_unsent = 0;  // constant after construction
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
    bool overflow ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
    bool send_header ABSL_GUARDED_BY(mu) = false;
  };

  static void Flush(const std::shared_ptr<State>& st) {
    WatchReactor* r = nullptr;
    grpc::Status finish_status;
    bool finish = false;
    {
      absl::MutexLock l(&st->mu);
      if (st->reactor == nullptr || st->finished) return;
      if (!st->overflow && st->writing) return;  // (as in SessionReactor::Flush)
      r = st->reactor;
      if (st->cancelled || st->overflow) {
        finish = true;
        st->finished = true;
        if (st->overflow) {
          finish_status = grpc::Status(
              grpc::StatusCode::RESOURCE_EXHAUSTED,
              absl::StrCat("watcher fell more than 1M events or ", st->max_unsent,
                           " bytes (max_unsent_bytes_per_stream) behind; re-watch"));
        }
      } else if (!st->queue.empty() || st->send_header) {
        r->out_.Clear();
        int64_t bytes = 0;
        while (!st->queue.empty()) {
          auto& [ev, size] = st->queue.front();
          if (r->out_.events_size() > 0 && bytes + size > st->max_message) break;
          bytes += size;
          *r->out_.add_events() = std::move(ev);
          st->queue.pop_front();
        }
        st->queued_bytes -= bytes;
        st->send_header = false;
        st->writing = true;
      } else {
        return;
      }
    }
    if (finish) {
      r->Finish(finish_status);
    } else {
      r->StartWrite(&r->out_);
    }
  }

  Backend* const backend_;
  uint64_t watch_id_ = 0;
  std::shared_ptr<State> state_;
  v1::WatchResponse out_;
};

template <typename Base>
class Rejected : public Base {
 public:
  explicit Rejected(grpc::Status s) { this->Finish(std::move(s)); }
  void OnDone() override { delete this; }
};

// ---------------------------------------------------------------------------------------------
class StoreService final : public v1::Store::CallbackService {
 public:
  StoreService(Backend* backend, std::string token, int64_t max_message, int64_t max_unsent)
      : backend_(backend), token_(std::move(token)), max_message_(max_message),
        max_unsent_(max_unsent) {}

  void set_fast_port(int port) { fast_port_ = port; }

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* ctx, const v1::InfoRequest*,
                                 v1::InfoResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    grpc::Status auth = Authenticate(ctx);
    if (auth.ok()) {
      resp->set_fast_port(fast_port_.load());
      resp->set_server_version("ember-store 0.1");
    }
    reactor->Finish(auth);
    return reactor;
  }

#define EMBER_STORE_UNARY(Method, field, ReqT, RespT)                                            \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* ctx, const v1::ReqT* req,        \
                                   v1::RespT* resp) override {                                   \
    Request r;                                                                                   \
    *r.mutable_##field() = *req;                                                                 \
    return Unary(ctx, r, [resp](Response& out) { *resp = std::move(*out.mutable_##field()); }); \
  }

  EMBER_STORE_UNARY(Set, set, SetRequest, SetResponse)
  EMBER_STORE_UNARY(Get, get, GetRequest, GetResponse)
  EMBER_STORE_UNARY(Add, add, AddRequest, AddResponse)
  EMBER_STORE_UNARY(CompareSet, compare_set, CompareSetRequest, CompareSetResponse)
  EMBER_STORE_UNARY(Wait, wait, WaitRequest, WaitResponse)
  EMBER_STORE_UNARY(Check, check, CheckRequest, CheckResponse)
  EMBER_STORE_UNARY(Delete, delete_, DeleteRequest, DeleteResponse)
  EMBER_STORE_UNARY(DeletePrefix, delete_prefix, DeletePrefixRequest, DeletePrefixResponse)
  EMBER_STORE_UNARY(NumKeys, num_keys, NumKeysRequest, NumKeysResponse)
  EMBER_STORE_UNARY(MultiGet, multi_get, MultiGetRequest, MultiGetResponse)
  EMBER_STORE_UNARY(MultiSet, multi_set, MultiSetRequest, MultiSetResponse)
  EMBER_STORE_UNARY(Append, append, AppendRequest, AppendResponse)
  EMBER_STORE_UNARY(ListKeys, list_keys, ListKeysRequest, ListKeysResponse)
  EMBER_STORE_UNARY(LeaseGrant, lease_grant, LeaseGrantRequest, LeaseGrantResponse)
  EMBER_STORE_UNARY(LeaseRefresh, lease_refresh, LeaseRefreshRequest, LeaseRefreshResponse)
  EMBER_STORE_UNARY(LeaseRevoke, lease_revoke, LeaseRevokeRequest, LeaseRevokeResponse)
#undef EMBER_STORE_UNARY

  grpc::ServerBidiReactor<v1::RequestBatch, v1::ResponseBatch>* Session(
      grpc::CallbackServerContext* ctx) override {
    grpc::Status auth = Authenticate(ctx);
    if (!auth.ok()) {
      return new Rejected<grpc::ServerBidiReactor<v1::RequestBatch, v1::ResponseBatch>>(auth);
    }
    return new SessionReactor(backend_, next_owner_.fetch_add(1) + 1, max_message_, max_unsent_);
  }

  grpc::ServerWriteReactor<v1::WatchResponse>* Watch(grpc::CallbackServerContext* ctx,
                                                     const v1::WatchRequest* req) override {
    grpc::Status auth = Authenticate(ctx);
    if (!auth.ok()) return new Rejected<grpc::ServerWriteReactor<v1::WatchResponse>>(auth);
    return new WatchReactor(backend_, *req, max_message_, max_unsent_);
  }

 private:
  grpc::Status Authenticate(grpc::CallbackServerContext* ctx) {
    if (token_.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    if (it != md.end() && TokenMatches(token_, it->second)) return grpc::Status::OK;
    spdlog::warn("store: rejected a call from {}: missing or wrong auth token", ctx->peer());
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing or wrong auth token: pass the token from --auth-token-file as "
                        "'authorization: Bearer <token>'");
  }

  template <typename Extract>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Request& req,
                                  Extract extract) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    grpc::Status auth = Authenticate(ctx);
    if (!auth.ok()) {
      reactor->Finish(auth);
      return reactor;
    }
    backend_->Execute(
        {&req},
        [reactor, extract](Response out) mutable {
          grpc::Status s = ResponseStatus(out);
          if (s.ok()) extract(out);
          reactor->Finish(s);
        },
        /*owner=*/0);
    return reactor;
  }

  Backend* const backend_;
  const std::string token_;
  const int64_t max_message_;  // largest message gRPC sends (answers are split below it)
  const int64_t max_unsent_;
  std::atomic<uint64_t> next_owner_{0};
  std::atomic<int> fast_port_{0};
};

}  // namespace

class StoreServer::Impl {
 public:
  std::unique_ptr<Backend> backend;
  std::unique_ptr<StoreService> service;
  base::StartedServer started;
  std::unique_ptr<FastPathServer> fast;
  bool shut_down = false;
};

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(StoreServerOptions options) {
  const int64_t frame_room = int64_t{kMaxFastFrameBytes} - (1 << 20);
  if (options.backend.max_response_bytes > frame_room) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_response_bytes=", options.backend.max_response_bytes, " exceeds what one transport "
        "frame carries (", frame_room, "); lower --max-response-bytes"));
  }
  auto impl = std::make_unique<Impl>();
  ASSIGN_OR_RETURN(impl->backend, options.make_backend
                                       ? options.make_backend(options.backend, options.clock)
                                       : NewMemoryBackend(options.backend, options.clock));
  base::GrpcServerOptions gopts;
  gopts.address = options.address;
  gopts.credentials = options.credentials;
  gopts.auth_token = options.auth_token;
  // Requests: a MultiSet or a Session batch of a few values. Answers: at most max_response_bytes
  // each (the backend refuses larger ones); a Session batch of many is split (SessionReactor).
  gopts.max_message_bytes = static_cast<int>(std::min<int64_t>(
      INT32_MAX, std::max(options.backend.max_value_bytes * 4, options.backend.max_response_bytes) +
                     (1 << 20)));
  gopts.max_connections = options.max_grpc_connections > 0
                              ? options.max_grpc_connections
                              : std::min(4096, base::ConnectionShare(8));
  gopts.max_connections_per_peer = options.max_grpc_connections_per_peer;
  impl->service = std::make_unique<StoreService>(
      impl->backend.get(), options.auth_token, gopts.max_message_bytes - (64 << 10),
      options.max_unsent_bytes_per_stream);
  ASSIGN_OR_RETURN(impl->started, base::StartGrpcServer(gopts, {impl->service.get()}));
  if (options.fast_path && options.credentials == nullptr) {
    std::string host = options.address.substr(0, options.address.rfind(':'));
    FastPathLimits limits = options.fast_path_limits;
    if (limits.max_connections <= 0) limits.max_connections = std::min(4096, base::ConnectionShare(4));
    if (limits.max_connections_per_peer <= 0) {
      limits.max_connections_per_peer = std::max(1, limits.max_connections / 2);
    }
    // Prefer the gRPC port + 1, so clients can dial the fast path without asking Info first.
    int want = options.fast_path_port;
    auto fast = FastPathServer::Start(host, want ? want : impl->started.port + 1,
                                      impl->backend.get(), options.auth_token, limits);
    if (!fast.ok() && want == 0) {
      fast = FastPathServer::Start(host, 0, impl->backend.get(), options.auth_token, limits);
    }
    if (!fast.ok()) return fast.status();
    impl->fast = std::move(*fast);
    impl->service->set_fast_port(impl->fast->port());
  }
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() { Shutdown(); }

int StoreServer::port() const { return impl_->started.port; }
int StoreServer::fast_port() const { return impl_->fast ? impl_->fast->port() : 0; }
std::string StoreServer::address() const { return impl_->started.address; }
Backend* StoreServer::backend() { return impl_->backend.get(); }

void StoreServer::Shutdown() {
  if (impl_->shut_down) return;
  impl_->shut_down = true;
  if (impl_->fast) impl_->fast->Stop();
  impl_->backend->Shutdown();
  // Streams still open after the grace period are cancelled.
  impl_->started.server->Shutdown(std::chrono::system_clock::now() +
                                  std::chrono::milliseconds(500));
}

}  // namespace ember::store
