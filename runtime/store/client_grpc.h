// The store client's gRPC transport: the channel and stub, the pipelined Session stream (a
// reactor that reports to its owner, the Connection), the Info call that finds the fast path, and
// watches (a server-streaming Watch call per watch).
//
// Thread-safety: NewStub and QueryInfo are thread-safe. A SessionStream's callbacks run on gRPC
// threads; the flags below are guarded by the owner's mutex (see each). StartWatch's Watch is
// thread-safe.
#ifndef EMBER_RUNTIME_STORE_CLIENT_GRPC_H_
#define EMBER_RUNTIME_STORE_CLIENT_GRPC_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/store.grpc.pb.h"
#include "runtime/store/client.h"

namespace ember::store::client_internal {

// A channel to options.address (options.credentials, else plaintext) with the client's keepalive,
// message-size and reconnect settings, and one TCP connection of its own; and a stub on it.
std::unique_ptr<v1::Store::Stub> NewStub(const ClientOptions& options,
                                         std::shared_ptr<grpc::Channel>* channel);

// Asks the server for Info (deadline options.dial_timeout) with the client's token, on `ctx`
// (fresh; the caller may TryCancel it from another thread meanwhile).
grpc::Status QueryInfo(v1::Store::Stub* stub, const ClientOptions& options,
                       grpc::ClientContext* ctx, v1::InfoResponse* info);

// One Session stream. Created started (a read posted); deletes itself after OnStreamDone, then
// tells the owner (OnStreamReleased).
class SessionStream : public grpc::ClientBidiReactor<v1::RequestBatch, v1::ResponseBatch> {
 public:
  // What the stream reports, on gRPC threads, to its owner.
  class Owner {
   public:
    virtual ~Owner() = default;
    virtual void OnBatch(SessionStream* s, v1::ResponseBatch* batch) = 0;
    // The read side ended. Returns whether the stream's write hold may be released now (no write
    // being started or in flight); otherwise the owner releases it from OnWriteDone.
    virtual bool OnReadEnded(SessionStream* s) = 0;
    virtual void OnWriteDone(SessionStream* s, bool ok) = 0;
    // The stream ended with `status`; it is deleted when this returns.
    virtual void OnStreamDone(SessionStream* s, const grpc::Status& status) = 0;
    // Last call, after the stream was deleted. Until then the owner must keep its channel: the
    // stream's ClientContext holds a reference to it, and the channel's last reference must not
    // go on a gRPC thread (see SessionStream::OnDone).
    virtual void OnStreamReleased() = 0;
  };

  SessionStream(Owner* owner, v1::Store::Stub* stub, const std::string& auth_token);

  // Releases the hold taken at creation (OnDone waits for it: no write may be pending then).
  void ReleaseWriteHold() { RemoveHold(); }
  void Cancel() { ctx_.TryCancel(); }

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override { owner_->OnWriteDone(this, ok); }
  void OnDone(const grpc::Status& s) override;

  v1::RequestBatch out;           // the batch being written; owner's mutex while !writing
  bool writing = false;           // owner's mutex: a StartWrite(&out) is being made or in flight
  bool read_ended = false;        // owner's mutex: no more writes may start
  bool hold_after_write = false;  // owner's mutex: OnWriteDone releases the write hold

 private:
  Owner* const owner_;
  grpc::ClientContext ctx_;
  v1::ResponseBatch in_;
};

// Testing only: SessionStream::OnDone sleeps `delay` between reporting the end and deleting the
// stream (widens the window in which an owner could drop the channel before the stream does).
void SetStreamDeleteDelayForTest(absl::Duration delay);

// Starts a watch of `req` on `stub` and waits (up to `timeout`) until the server confirmed it.
// Events go to on_event (on a gRPC thread, in order); on_end (optional) once if the stream ends
// with an error. `stub` must outlive the returned Watch.
absl::StatusOr<std::unique_ptr<Watch>> StartWatch(
    v1::Store::Stub* stub, const ClientOptions& options, const v1::WatchRequest& req,
    std::function<void(const WatchEvent&)> on_event, std::function<void(absl::Status)> on_end,
    absl::Duration timeout);

}  // namespace ember::store::client_internal

#endif  // EMBER_RUNTIME_STORE_CLIENT_GRPC_H_
