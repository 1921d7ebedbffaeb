// ember::store::Client: the C++ client of the rendezvous store (ember-store).
//
// A Client is a cheap, copyable handle: copies and prefix views share one connection (one
// long-lived, pipelined gRPC stream). Every method is thread-safe; calls from many threads are
// coalesced into batches on the stream, so concurrent callers pipeline for free.
//
//   ASSIGN_OR_RETURN(Client c, Client::Connect({.address = "127.0.0.1:29500"}));
//   Client job = c.WithPrefix("jobs/j1/attempt/0/");     // every key below is scoped
//   RETURN_IF_ERROR(job.Set("pg/world/addr/0", "10.0.0.1:4000"));
//   ASSIGN_OR_RETURN(std::string v, job.Get("pg/world/addr/1", {.wait = true}));
//   RETURN_IF_ERROR(job.Barrier("start", world_size, absl::Seconds(60)));
//
// Errors: UNAVAILABLE when the server cannot be reached before the call's deadline (the client
// reconnects with jittered exponential backoff until then); DEADLINE_EXCEEDED naming the keys when a
// blocking call times out; INVALID_ARGUMENT naming the limit when a key or value is too large;
// UNAUTHENTICATED when the token is wrong; FAILED_PRECONDITION when the server speaks TLS and this
// client does not, or the reverse (checked after failed attempts; not retried). Retries: requests not yet sent, and idempotent requests
// (Set, Get, Wait, Check, Delete, MultiGet, MultiSet, ListKeys, NumKeys, lease refresh), are re-sent
// after a reconnect. A non-idempotent request (Add, Append, CompareSet, DeletePrefix, lease grant)
// that was in flight when the connection broke fails with UNAVAILABLE "outcome unknown" instead of
// being applied twice.
#ifndef EMBER_RUNTIME_STORE_CLIENT_H_
#define EMBER_RUNTIME_STORE_CLIENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace grpc {
class ChannelCredentials;
}

namespace ember::store {

struct ClientOptions {
  std::string address;                        // host:port of ember-store (or a daemon hosting it)
  std::string auth_token;                     // sent as "authorization: Bearer <token>" if set
  // null = plaintext (loopback default). Set (TLS: base::MakeChannelCredentials): gRPC with
  // these credentials only, never the plaintext fast path.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  absl::Duration default_timeout = absl::Seconds(300);     // per call, unless CallOptions says
  absl::Duration connect_timeout = absl::Seconds(30);      // Connect() gives up after this
  // One connection attempt (the TCP connect, the fast path's hello, the Info query) gives up
  // after this, and the next attempt dials a fresh socket. The kernel's own SYN retries back off
  // to seconds, so a short value reconnects sooner after a network outage (emberd's lease keeper
  // uses a fraction of a second).
  absl::Duration dial_timeout = absl::Seconds(5);
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(2);
  // Use the server's plain-TCP fast path when it offers one (Info.fast_port); otherwise, or when
  // false, the gRPC Session stream. Both carry the same requests with the same semantics.
  bool use_fast_path = true;
  // On the fast path with a loopback address, use the server's abstract Unix socket (same host,
  // cheaper than TCP loopback) when it has one.
  bool use_unix_socket = true;
  // Fencing (proto/store.proto Fence): when set, every write of this client carries
  // (fence_key, fence_epoch) and the server refuses it with FAILED_PRECONDITION "write refused by
  // fence ..." once the key holds a larger integer (IsFenced). A worker of attempt N of job J uses
  // job keys' Fence(J) and N (runtime/worker), so it cannot write once attempt N+1 has started.
  std::string fence_key;
  int64_t fence_epoch = 0;
};

// Whether `s` is the server's refusal of a fenced write (the writer is stale: it must stop).
bool IsFenced(const absl::Status& s);

struct CallOptions {
  // For Get/MultiGet: block until the key(s) exist (like TCPStore.get).
  bool wait = false;
  // Overall deadline of the call, including blocking and reconnects. Zero = the client's default.
  absl::Duration timeout = absl::ZeroDuration();
};

struct CompareSetResult {
  bool swapped = false;
  bool exists = false;    // whether the key exists after the call
  std::string current;    // its value after the call
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  std::string key;        // full key, including any prefix of the view that created the watch
  std::string value;
  int64_t revision = 0;   // global, strictly increasing
};

// A running watch. Destroying it (or calling Cancel) stops delivery; after Cancel returns, the
// callback is not running and will not be called again.
class Watch {
 public:
  virtual ~Watch() = default;
  virtual void Cancel() = 0;
  // The status the stream ended with (OK while running or after Cancel).
  virtual absl::Status status() const = 0;
};

class Connection;  // internal: the shared stream (client.cc)

class Client {
 public:
  // Connects (waits until the server answers or connect_timeout passes).
  static absl::StatusOr<Client> Connect(const ClientOptions& options);

  // A view whose keys are prefixed by prefix() + `prefix`. Shares this client's connection.
  Client WithPrefix(absl::string_view prefix) const;
  const std::string& prefix() const { return prefix_; }
  const std::string& address() const;

  absl::Status Set(absl::string_view key, absl::string_view value, CallOptions opts = {});
  // NOT_FOUND if the key is absent and !opts.wait; with wait, DEADLINE_EXCEEDED after the timeout.
  absl::StatusOr<std::string> Get(absl::string_view key, CallOptions opts = {});
  // Atomically adds `delta` to the int64 stored (as decimal text, like TCPStore) at key; returns the
  // new value. A missing key counts as 0; a non-integer value is INVALID_ARGUMENT.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta, CallOptions opts = {});
  // Sets `desired` if the key holds `expected` (or, with expected == nullopt, if it is absent).
  absl::StatusOr<CompareSetResult> CompareSet(absl::string_view key,
                                              std::optional<std::string> expected,
                                              absl::string_view desired, CallOptions opts = {});
  // Blocks until every key exists; DEADLINE_EXCEEDED names the keys still missing.
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys, CallOptions opts = {});
  absl::StatusOr<bool> Delete(absl::string_view key, CallOptions opts = {});
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix, CallOptions opts = {});
  // Number of keys under prefix() + `prefix`.
  absl::StatusOr<int64_t> NumKeys(absl::string_view prefix = "", CallOptions opts = {});
  // One entry per key: nullopt where absent (with opts.wait, blocks until all exist).
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, CallOptions opts = {});
  absl::Status MultiSet(const std::vector<std::pair<std::string, std::string>>& kvs,
                        CallOptions opts = {});
  // Appends to the value (creating it); returns the new size in bytes.
  absl::StatusOr<int64_t> Append(absl::string_view key, absl::string_view value,
                                 CallOptions opts = {});
  // Keys under prefix() + `prefix`, sorted, with this view's prefix stripped.
  absl::StatusOr<std::vector<std::string>> ListKeys(absl::string_view prefix = "",
                                                    CallOptions opts = {});

  // Leases: keys set with a lease are deleted when it expires (ttl without a refresh).
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl, CallOptions opts = {});
  absl::Status RefreshLease(int64_t lease_id, CallOptions opts = {});  // NOT_FOUND if expired
  absl::Status RevokeLease(int64_t lease_id, CallOptions opts = {});
  absl::Status SetWithLease(absl::string_view key, absl::string_view value, int64_t lease_id,
                            CallOptions opts = {});

  // Calls `on_event` (on an internal thread, in revision order, one at a time) for every change
  // under prefix() + `prefix`. With send_initial, existing keys are delivered first as kPut.
  // `on_end` (optional) is called once if the stream ends with an error. Returns once the server
  // has registered the watch: every change after the return is delivered.
  absl::StatusOr<std::unique_ptr<Watch>> WatchPrefix(
      absl::string_view prefix, std::function<void(const WatchEvent&)> on_event,
      bool send_initial = false, std::function<void(absl::Status)> on_end = nullptr);

  // n callers with the same key return OK once all n have arrived (Add, then Wait).
  // The barrier is single-use per key.
  absl::Status Barrier(absl::string_view key, int n, absl::Duration timeout);

  // Pipelining without blocking: starts a call and returns; `done` runs once, on an internal
  // thread (it must not block on this client). Same retry rules as the blocking calls: an
  // AddAsync in flight when the connection breaks fails "outcome unknown", never re-sent. For a
  // bounded window of calls driven by one thread, Pipeline (below) is cheaper.
  void SetAsync(absl::string_view key, absl::string_view value,
                std::function<void(absl::Status)> done, CallOptions opts = {});
  void GetAsync(absl::string_view key, std::function<void(absl::StatusOr<std::string>)> done,
                CallOptions opts = {});
  void AddAsync(absl::string_view key, int64_t delta,
                std::function<void(absl::StatusOr<int64_t>)> done, CallOptions opts = {});

 private:
  friend class Pipeline;
  Client(std::shared_ptr<Connection> conn, std::string prefix)
      : conn_(std::move(conn)), prefix_(std::move(prefix)) {}
  std::string Full(absl::string_view key) const;
  absl::Duration Timeout(const CallOptions& o) const;

  std::shared_ptr<Connection> conn_;
  std::string prefix_;
};

// Pipeline: up to `window` requests in flight on one Client's connection, driven by the thread
// that owns the Pipeline. A one-op-at-a-time caller pays a full round trip per op; a Pipeline
// keeps the connection busy instead (TCPStore's client cannot: it waits for each answer).
//
//   Pipeline p(client, /*window=*/16);
//   for (int i = 0; i < n; ++i) p.Add("counter", 1);          // blocks only while 16 are in flight
//   RETURN_IF_ERROR(p.Drain());                               // first error of any op, else OK
//
// Requests are queued and sent together when the window fills, on Flush(), or on Drain(): each
// frame on the wire carries up to `window` requests. The server executes a connection's requests
// in order, so answers (and `done` callbacks) come in the order the calls were made. Each op fails
// on its own (an Add on a non-integer value fails that op only). Retry rules are the Client's: a
// queued request not yet sent, or a sent idempotent one (Set), goes again after a reconnect; a sent
// Add whose connection breaks fails UNAVAILABLE "outcome unknown" and is never re-sent. Every op
// finishes by its deadline (CallOptions.timeout, else the client's default), so Drain cannot hang
// longer than that.
//
// `done` callbacks run on the thread that reads the answer: usually the owner inside Add/Set/
// Drain, sometimes another thread using the same connection. They must not block on the store.
// Thread-safety: one thread uses a Pipeline at a time; pipelines and other callers may share a
// Client. The Pipeline keeps the connection alive; its destructor drains.
class Pipeline {
 public:
  // window >= 1 (smaller values are raised to 1).
  Pipeline(const Client& client, int window);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  void Add(absl::string_view key, int64_t delta,
           std::function<void(absl::StatusOr<int64_t>)> done = nullptr, CallOptions opts = {});
  void Set(absl::string_view key, absl::string_view value,
           std::function<void(absl::Status)> done = nullptr, CallOptions opts = {});
  // Sends what is queued without waiting.
  void Flush();
  // Sends what is queued and waits until every op has finished (its `done` has returned).
  // Returns the first error of an op since the last Drain, or OK.
  absl::Status Drain();
  int window() const { return window_; }

  struct Group;  // internal (client.cc)

 private:
  Client client_;
  const int window_;
  std::shared_ptr<Group> group_;
};

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_CLIENT_H_
