// The store client's gRPC transport (see client_grpc.h).
#include "runtime/store/client_grpc.h"

#include <atomic>
#include <chrono>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace ember::store::client_internal {
namespace {

void AddToken(const ClientOptions& options, grpc::ClientContext* ctx) {
  if (!options.auth_token.empty()) {
    ctx->AddMetadata("authorization", "Bearer " + options.auth_token);
  }
}

// A Watch backed by a server-streaming call.
class WatchImpl : public Watch, public grpc::ClientReadReactor<v1::WatchResponse> {
 public:
  WatchImpl(v1::Store::Stub* stub, const ClientOptions& options, const v1::WatchRequest& req,
            std::function<void(const WatchEvent&)> on_event,
            std::function<void(absl::Status)> on_end)
      : on_event_(std::move(on_event)), on_end_(std::move(on_end)) {
    AddToken(options, &ctx_);
    stub->async()->Watch(&ctx_, &req, this);
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

std::unique_ptr<v1::Store::Stub> NewStub(const ClientOptions& options,
                                         std::shared_ptr<grpc::Channel>* channel) {
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
  auto creds = options.credentials ? options.credentials : grpc::InsecureChannelCredentials();
  *channel = grpc::CreateCustomChannel(options.address, creds, args);
  return v1::Store::NewStub(*channel);
}

grpc::Status QueryInfo(v1::Store::Stub* stub, const ClientOptions& options,
                       grpc::ClientContext* ctx, v1::InfoResponse* info) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(absl::ToInt64Milliseconds(options.dial_timeout)));
  AddToken(options, ctx);
  v1::InfoRequest req;
  return stub->Info(ctx, req, info);
}

SessionStream::SessionStream(Owner* owner, v1::Store::Stub* stub, const std::string& auth_token)
    : owner_(owner) {
  if (!auth_token.empty()) ctx_.AddMetadata("authorization", "Bearer " + auth_token);
  stub->async()->Session(&ctx_, this);
  StartRead(&in_);
  AddHold();  // released when the stream is done writing (OnDone needs no pending writes)
  StartCall();
}

void SessionStream::OnReadDone(bool ok) {
  if (!ok) {
    if (owner_->OnReadEnded(this)) RemoveHold();
    return;
  }
  owner_->OnBatch(this, &in_);
  in_.Clear();
  StartRead(&in_);
}

namespace {
std::atomic<int64_t> g_delete_delay_us{0};  // SetStreamDeleteDelayForTest
}  // namespace

void SetStreamDeleteDelayForTest(absl::Duration delay) {
  g_delete_delay_us.store(absl::ToInt64Microseconds(delay));
}

// Runs on a gRPC callback thread: one of the "nexting" threads of gRPC 1.51's process-wide
// callback completion queue, which exists while some channel or server uses it. Deleting the
// stream destroys its ClientContext, and with it a std::shared_ptr<grpc::Channel>. Were that the
// channel's last reference (the owner already gone, the servers shut down), ~Channel would release
// the queue's last user here, and the queue's teardown joins its nexting threads, this one
// included: the self-join fails silently (EDEADLK), the queue is freed, and this thread then polls
// the freed queue and aborts (ref_counted.h "prior > 0" in grpc_cq_internal_unref). So the owner
// learns the stream is gone (OnStreamReleased) only after the delete, and keeps the channel until
// then: its last reference goes on the owner's thread.
void SessionStream::OnDone(const grpc::Status& s) {
  Owner* const owner = owner_;
  owner->OnStreamDone(this, s);
  const int64_t delay_us = g_delete_delay_us.load();
  if (delay_us > 0) absl::SleepFor(absl::Microseconds(delay_us));
  delete this;
  owner->OnStreamReleased();
}

absl::StatusOr<std::unique_ptr<Watch>> StartWatch(
    v1::Store::Stub* stub, const ClientOptions& options, const v1::WatchRequest& req,
    std::function<void(const WatchEvent&)> on_event, std::function<void(absl::Status)> on_end,
    absl::Duration timeout) {
  auto w = std::make_unique<WatchImpl>(stub, options, req, std::move(on_event), std::move(on_end));
  absl::Status s = w->WaitStarted(timeout);
  if (!s.ok()) return s;
  return std::unique_ptr<Watch>(std::move(w));
}

}  // namespace ember::store::client_internal
