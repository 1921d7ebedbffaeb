// Backend: the state machine behind the Store service (keys, revisions, waiters, watches, leases).
//
// The gRPC service only translates calls; everything with semantics lives here, behind an interface
// so an etcd-backed implementation (HA clusters) can replace the in-memory/WAL one later.
//
// Thread-safety: all methods are thread-safe. Callbacks (`done`, watch sinks) are invoked without
// the backend's lock held for `done`; watch sinks are invoked WITH it held (that is what keeps
// events in revision order), so a sink must only enqueue: it must not block or call the backend.
#ifndef EMBER_RUNTIME_STORE_BACKEND_H_
#define EMBER_RUNTIME_STORE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/store.pb.h"
#include "runtime/base/clock.h"

namespace ember::store {

enum class FsyncPolicy {
  kNever,   // write() before ack: survives kill -9 of the server, not a power loss
  kAlways,  // write() + fdatasync() before ack (group commit): survives power loss
};

struct BackendOptions {
  int64_t max_key_bytes = 4096;               // INVALID_ARGUMENT names this limit
  int64_t max_value_bytes = 16 << 20;         // 16 MiB; INVALID_ARGUMENT names this limit
  int64_t max_keys_per_request = 100000;      // MultiGet/MultiSet/Wait/Check
  // Largest answer to one request (MultiGet values, ListKeys keys): RESOURCE_EXHAUSTED naming this
  // limit above it. Must be >= max_value_bytes; transports size their frames from it.
  int64_t max_response_bytes = 64 << 20;
  absl::Duration default_wait_timeout = absl::Seconds(300);  // blocking Get/Wait with timeout 0
  std::string data_dir;                       // empty = in-memory only; created 0700, files 0600
  // A damaged log (a bad record followed by valid ones) makes recovery fail with DATA_LOSS naming
  // the offset, leaving the file untouched. With repair_wal (ember-store --repair) recovery keeps
  // the records before the damage, saves a copy of the log as wal.log.damaged-<time> and truncates.
  bool repair_wal = false;
  FsyncPolicy fsync = FsyncPolicy::kNever;
  int64_t compact_after_bytes = 64 << 20;     // snapshot + truncate the WAL past this size
};

class Backend {
 public:
  using Done = std::function<void(v1::Response)>;
  using WatchSink = std::function<void(const v1::WatchEvent&)>;

  virtual ~Backend() = default;

  // Executes each request in order; `done` is called exactly once per request (immediately for
  // non-blocking ops, later for blocking Get/Wait/MultiGet). Responses carry the request's id and
  // a status code. Blocking requests are associated with `owner` (non-zero) so that
  // CancelOwner(owner) can drop them when the caller goes away (their `done` is then called with
  // CANCELLED). Write acknowledgements are durable per BackendOptions::fsync when `done` runs.
  virtual void Execute(const std::vector<const v1::Request*>& requests, const Done& done,
                       uint64_t owner) = 0;
  virtual void CancelOwner(uint64_t owner) = 0;

  // One request, answered to the calling thread, which blocks until the answer (a blocking
  // Get/Wait/MultiGet: until its key appears or its timeout). Same semantics and ordering as
  // Execute({&request}, ..., owner). For callers that wait anyway (a synchronous in-process
  // client); event loops must use Execute. The default runs Execute and waits; the etcd backend
  // makes its etcd round trips on the calling thread (no hand-off to its pool) when `owner` has
  // nothing queued.
  virtual v1::Response Call(const v1::Request& request, uint64_t owner);

  // Registers a watch on `prefix`. With send_initial, current keys are delivered first as PUTs.
  // Returns an id for RemoveWatch.
  virtual uint64_t AddWatch(const std::string& prefix, bool send_initial, WatchSink sink) = 0;
  virtual void RemoveWatch(uint64_t id) = 0;

  // Fails every parked waiter with UNAVAILABLE and stops background threads. Idempotent.
  virtual void Shutdown() = 0;

  // Introspection for tests and metrics.
  virtual int64_t revision() const = 0;
  virtual int64_t num_waiters() const = 0;

 protected:
  // Calls `start` with a Done, then blocks until that Done has run once; returns its answer.
  static v1::Response AwaitAnswer(const std::function<void(const Done&)>& start);
};

// The default backend: in-memory, optionally durable with a write-ahead log + snapshots in
// options.data_dir (recovered on start; a torn final record from a crash is discarded; damage in
// the middle of the log is DATA_LOSS unless options.repair_wal).
// `clock` is borrowed and must outlive the backend (null = real clock).
absl::StatusOr<std::unique_ptr<Backend>> NewMemoryBackend(const BackendOptions& options,
                                                          base::Clock* clock);

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_BACKEND_H_
