// The store client's retry rules: which requests may be sent twice, which transport errors end
// every call instead of a reconnect, and how long to wait before the next connection attempt.
// client.h states the rules to users; RequestQueue (client_queue.h) and Connection apply them.
//
// Thread-safety: thread-safe (pure functions; Backoff's generator belongs to the caller).
#ifndef EMBER_RUNTIME_STORE_CLIENT_RETRY_H_
#define EMBER_RUNTIME_STORE_CLIENT_RETRY_H_

#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/store.pb.h"
#include "runtime/store/client.h"

namespace ember::store::client_internal {

// Whether `r` may be re-sent after a connection broke while it was in flight: applying it twice
// gives the same state and answer. Add, Append, CompareSet, DeletePrefix and LeaseGrant may not.
bool Idempotent(const v1::Request& r);

// Whether the server holds `r` until its own timeout (a Wait, or a Get/MultiGet with wait): the
// server answers DEADLINE_EXCEEDED naming the missing keys at the call's timeout, so the client's
// own deadline for it is kServerSlack later; other requests expire at the timeout itself.
bool BlocksOnServer(const v1::Request& r);
inline constexpr absl::Duration kServerSlack = absl::Milliseconds(250);

// A connection counts as silent (RequestQueue::Expire) only after this long without any answer:
// a call with a very short deadline expiring on a healthy connection proves nothing.
inline constexpr absl::Duration kMinSilence = absl::Milliseconds(500);

// "Set('k')", "Wait([a, b])", ... for error messages.
std::string Describe(const v1::Request& r);

// A transport error that no reconnect fixes (bad token, permission, no such service, TLS
// mismatch): every pending call fails with it.
bool IsPermanent(absl::StatusCode code);

// The wait before the next connection attempt after `failures` failed ones (>= 1): doubling from
// options.initial_backoff up to options.max_backoff, times a random factor in [0.5, 1).
absl::Duration Backoff(const ClientOptions& options, int failures, std::mt19937* rng);

// The status a response carries (OK for code 0).
absl::Status ToStatus(const v1::Response& r);

}  // namespace ember::store::client_internal

#endif  // EMBER_RUNTIME_STORE_CLIENT_RETRY_H_
