// The node lease keeper's decisions (lease.cc) as pure functions: whether a failed lease refresh
// means the node is lost, and how often a lost node tries to register again. No store, no clock:
// the keeper passes the times it measured. Thread-safe (pure).
#ifndef EMBER_RUNTIME_DAEMON_LEASE_POLICY_H_
#define EMBER_RUNTIME_DAEMON_LEASE_POLICY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ember::daemon {

// Why a failed refresh of the node's lease makes the node lost, or "" to keep retrying. `s` is the
// failed try's status (of the refresh, or of the fresh dial before it: `answered` is false then),
// `since_ack` the time since the last refresh the store acknowledged, `ttl` the lease's TTL and
// `margin` the slack over it. The reason is what the attempts' stop keys say, and always starts
// with "node lost: <node>" (the scheduler's reason for a node whose lease is gone):
//   * NOT_FOUND answered by the store: the lease expired there. "node lost: <node>".
//   * UNAUTHENTICATED or PERMISSION_DENIED (refresh or dial): the store refuses this daemon's
//     credentials; no retry heals that, and no refresh can keep the lease alive.
//     "node lost: <node>: store refused the lease refresh: <status>; check the daemon's store token".
//   * anything else (unreachable, INVALID_ARGUMENT, ...) once since_ack > ttl + margin: the store
//     applied the last acknowledged refresh before it was acknowledged, so it has expired the lease
//     by now whatever it answers later. "node lost: <node>: no lease refresh acknowledged for <d>
//     (lease_ttl <ttl>): the store has expired the lease".
std::string LeaseLostReason(const std::string& node, const absl::Status& s, bool answered,
                            absl::Duration since_ack, absl::Duration ttl, absl::Duration margin);

// True for the errors of LeaseLostReason's second rule (the store refuses the credentials).
bool RefusesCredentials(const absl::Status& s);

// The wait before a lost node's next try to register again after `failures` (>= 1) failed tries:
// 0.5 s doubling, at most 5 s. The first try comes at once (the store usually takes it).
absl::Duration RegisterRetryDelay(int failures);

// Whether the keeper logs the `failures`-th failed try (>= 1) to register again, `since_log` after
// the last logged one: the first three, then one every 30 s (a revoked token can last for hours).
bool LogRegisterFailure(int failures, absl::Duration since_log);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_LEASE_POLICY_H_
