// Connection: what every copy of a store::Client shares: the request queue (client_queue.h), one
// transport at a time (the fast-path socket, client_fast.h, or the gRPC Session stream,
// client_grpc.h), a timer thread that fails requests at their deadline and schedules reconnects
// with backoff (client_retry.h) while requests are pending, and a dialer thread that makes the
// connection attempts (a dial to a silent store can take dial_timeout; no deadline waits on it).
//
// Deadlines hold against a silent store (its host cut off, or the process stopped: the socket
// stays open, nothing is answered): a request fails at its deadline (+ kServerSlack for requests
// the server holds). When one expires after it was sent and nothing at all came back on the
// transport since then, the transport is dropped at once (the fast socket shut down, the gRPC
// stream cancelled): idempotent requests go again on a fresh connection, in-flight others fail
// "outcome unknown", and answers still arriving on the dropped one are discarded.
//
// Reading the fast socket: one "reader role" at a time. A synchronous caller reads its own answer
// when the role is free (no thread hand-off on the hot path); a background reader thread takes the
// role only while requests whose caller does not read (async, Watch-free calls) are pending.
//
// Thread-safety: every public method is thread-safe. Callbacks (`done`) run exactly once, never
// with the mutex held, on an internal thread or on a caller waiting in AwaitReading; they must not
// block on this connection. Lock order: stub_mu_ and mu_ are never held together.
#ifndef EMBER_RUNTIME_STORE_CLIENT_CONNECTION_H_
#define EMBER_RUNTIME_STORE_CLIENT_CONNECTION_H_

#include <memory>
#include <random>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/store.grpc.pb.h"
#include "runtime/store/client.h"
#include "runtime/store/client_fast.h"
#include "runtime/store/client_framing.h"
#include "runtime/store/client_grpc.h"
#include "runtime/store/client_queue.h"

namespace ember::store {

// A Pipeline's requests in flight; guarded by the mutex of the Connection they run on.
struct Pipeline::Group {
  int in_flight = 0;
  absl::Status first_error;
};

class Connection : private client_internal::SessionStream::Owner {
 public:
  using Done = client_internal::Done;

  // Starts the timer thread; connects on the first call.
  explicit Connection(ClientOptions options);
  // Closes the transport, joins the threads and fails what is pending with CANCELLED.
  ~Connection() override;

  const ClientOptions& options() const { return options_; }

  // The gRPC stub, created on first use: a client that only uses the fast path never pays for
  // gRPC's channel set-up.
  v1::Store::Stub* stub() ABSL_LOCKS_EXCLUDED(stub_mu_);

  // Queues `req` (its id is assigned here); `done` runs exactly once: with the answer, or an error
  // at `timeout` or when the connection breaks (client_retry.h rules). `caller_reads`: the caller
  // will wait in AwaitReading for the answer, so the background reader need not. `send`: send now
  // (else it waits in the queue for the next Flush).
  void Call(v1::Request req, absl::Duration timeout, Done done, bool caller_reads = false,
            bool send = true) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs one request and waits for its answer on the calling thread.
  v1::Response CallSync(v1::Request req, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // Sends every queued request (no-op while disconnected: they go once connected).
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);

  // --- caller-driven groups of requests (Pipeline) ----------------------------------------------
  // Queues `req` in group `g` without sending it; `done` runs, then the group's count drops.
  void CallInGroup(const std::shared_ptr<Pipeline::Group>& g, v1::Request req,
                   absl::Duration timeout, std::function<absl::Status(v1::Response)> done);
  // Returns once fewer than `window` of the group's requests are in flight (flushing first if
  // not): the caller reads answers itself meanwhile.
  void AwaitRoom(Pipeline::Group* g, int window);
  // Flushes, waits until none of the group's requests is in flight; returns and clears its first
  // error.
  absl::Status DrainGroup(Pipeline::Group* g);

 private:
  // Blocks until `done()` (evaluated with mu_ held) is true. While the reader role is free the
  // calling thread reads the fast socket itself. Callbacks of answers read here run on this thread.
  template <typename F>
  void AwaitReading(F done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- gRPC Session stream (SessionStream::Owner) ----------------------------------------------
  void GrpcFlush() ABSL_LOCKS_EXCLUDED(mu_);
  void OnBatch(client_internal::SessionStream* s, v1::ResponseBatch* batch) override;
  bool OnReadEnded(client_internal::SessionStream* s) override;
  void OnWriteDone(client_internal::SessionStream* s, bool ok) override;
  void OnStreamDone(client_internal::SessionStream* s, const grpc::Status& status) override;
  void OnStreamReleased() override;

  // --- fast-path socket --------------------------------------------------------------------------
  // Sends everything queued over the fast socket. Returns false if the fast path is not connected.
  bool FastFlush() ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES the caller set reader_busy_ for `fd`. Reads at most one frame and delivers it if `fd`
  // is still the current socket, then releases the role; handles a closed connection.
  void ReadAsRole(int fd) ABSL_LOCKS_EXCLUDED(mu_);
  void ReaderLoop(int fd);
  // Adopts a connected fast socket and starts its background reader (dialer thread).
  void StartFast(int fd);

  // --- connecting, breaks, deadlines (timer and dialer threads) ---------------------------------
  // Answers from the current transport (failures_ and last_rx_ are reset).
  void Deliver(v1::ResponseBatch* batch, client_internal::Fired* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The transport is silent (RequestQueue::Expire): drop it and Broken() with `why`.
  void DropSilent(const std::string& why, client_internal::Fired* fail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The transport broke: re-queue what may be retried, fail the rest, schedule a reconnect.
  void Broken(absl::StatusCode code, const std::string& message, client_internal::Fired* fail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Broken() for a failed connection attempt; runs the failed callbacks.
  void AttemptFailed(const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);
  // One connection attempt (mu_ not held; dialer thread): fast path if the server offers it, else
  // gRPC.
  void ConnectOnce();
  void DialerLoop();
  // After failed attempts 1, 2, 4, 8, ...: a server whose TLS setting differs from this client's
  // never answers, so ask it what it speaks (base/wire_probe.h) and, on a mismatch, fail every
  // pending call with FAILED_PRECONDITION saying so instead of retrying until the deadline.
  bool TlsMismatch(client_internal::Fired* fail);
  void TimerLoop();
  bool connected() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stream_ != nullptr || fast_fd_ >= 0;
  }

  const ClientOptions options_;

  absl::Mutex stub_mu_;
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(stub_mu_);
  std::unique_ptr<v1::Store::Stub> stub_ ABSL_GUARDED_BY(stub_mu_);

  std::thread timer_;
  std::thread dialer_;
  bool grpc_only_ = false;  // dialer thread only
  bool guessed_ = false;    // dialer thread only: tried the gRPC port + 1 already
  std::thread reader_;      // dialer thread starts it; joined there or in the destructor
  client_internal::DialCancel dial_cancel_;  // the destructor aborts a dial in progress
  // Bytes read from the fast socket but not yet parsed; only the reader-role holder touches it.
  client_internal::FrameReader frames_;

  absl::Mutex mu_;
  client_internal::RequestQueue queue_ ABSL_GUARDED_BY(mu_);
  client_internal::SessionStream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Streams not yet deleted (OnStreamReleased): ~Connection waits for them before the channel goes.
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;
  int failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::string tls_hint_ ABSL_GUARDED_BY(mu_);  // what the TLS probe adds to last_error_
  absl::Time next_attempt_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::mt19937 rng_ ABSL_GUARDED_BY(mu_){std::random_device{}()};
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool kick_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time timer_wake_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool connecting_ ABSL_GUARDED_BY(mu_) = false;  // an attempt is wanted or under way
  bool dial_wanted_ ABSL_GUARDED_BY(mu_) = false;  // the timer asks the dialer for an attempt
  grpc::ClientContext* info_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;  // the dialer's Info call
  // When the current transport was set up or last delivered an answer.
  absl::Time last_rx_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int fast_fd_ ABSL_GUARDED_BY(mu_) = -1;
  bool fast_writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reader_busy_ ABSL_GUARDED_BY(mu_) = false;  // someone holds the reader role
  int old_fd_ ABSL_GUARDED_BY(mu_) = -1;            // last fast socket, closed on replacement
};

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_CLIENT_CONNECTION_H_
