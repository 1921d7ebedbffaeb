// The node lease keeper (lease thread): refreshes the node's lease every lease_refresh on a store
// connection of its own, and handles the lease's loss.
//
// Riding through a store outage shorter than the lease: a refresh stuck on a dead connection is
// not retried there (TCP's retransmissions back off to seconds, and the answer would come too
// late): after lease_refresh without an answer the keeper drops that connection and dials a fresh
// one per try (ClientOptions::dial_timeout), so a refresh reaches the store within about one
// lease_refresh of the network's return. Nothing else shares that connection, so a busy control
// loop or a slow node-record write never delays a refresh.
//
// The node is lost (lease_policy.h LeaseLostReason) when the store answers NOT_FOUND (the lease
// expired: the node's keys and device claims are gone and the scheduler may already have
// restarted its jobs elsewhere), when it refuses the daemon's credentials (UNAUTHENTICATED,
// PERMISSION_DENIED: no retry heals that), or when lease_ttl (+ one try) has passed since the last
// acknowledged refresh, whatever the error (the store has expired the lease by then; a cut-off
// node no longer waits for the store to say so). Then, every time:
//   1. this node's running attempts are stopped at once (SIGTERM: the ranks dump their flight
//      recorders; SIGKILL after kill_grace), with the reason "node lost: <node>[: why]";
//   2. once the store takes calls again: their stop keys get that reason (the reason the scheduler
//      records; first writer wins; supervise.cc also writes it before reporting their exits), the
//      keeper waits until their workers are reaped (at most kill_grace + 3 s), revokes the old
//      lease if the store still holds it, takes a new one, claims under it the devices of attempts
//      still not released (so the scheduler places nothing on them), and registers the node.
//      Failed tries are repeated after 0.5 s doubling to 5 s, logged at a bounded rate.
// Workers that keep running meanwhile cannot write: the restarted attempt fences them off
// (schedule.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/lease_policy.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

absl::Duration Daemon::Impl::LeaseTryTimeout() const {
  return std::clamp(opts.lease_refresh, absl::Milliseconds(250), absl::Seconds(1));
}

void Daemon::Impl::LeaseLoop() {
  store::ClientOptions co;
  co.address = store_addr;
  co.auth_token = opts.auth_token;
  co.credentials = store_credentials;
  co.default_timeout = co.connect_timeout = co.dial_timeout = LeaseTryTimeout();
  std::optional<store::Client> keeper;
  // Init refreshed or granted the lease just before this thread started.
  absl::Time acked = absl::Now();                   // the last acknowledged refresh
  absl::Time failing_since = absl::InfinitePast();  // first failed try of the current outage
  std::string lost;        // non-empty: the node is lost for this reason, not registered
  int register_failures = 0;
  absl::Time logged = absl::InfinitePast();
  absl::Duration wait = opts.lease_refresh;
  while (!stop.WaitForNotificationWithTimeout(wait)) {
    wait = opts.lease_refresh;
    const absl::Time t0 = absl::Now();
    absl::Status s;
    if (!keeper) {
      auto c = store::Client::Connect(co);  // one fresh dial, at most LeaseTryTimeout
      if (c.ok()) keeper = *c;
      s = c.status();
    }
    if (lost.empty()) {
      if (keeper) s = keeper->RefreshLease(lease.load());
      if (s.ok()) {
        acked = absl::Now();
        if (failing_since != absl::InfinitePast()) {
          spdlog::info("lease keeper: the store answers again after {:.1f} s; lease {} kept",
                       absl::ToDoubleSeconds(acked - failing_since), lease.load());
          failing_since = absl::InfinitePast();
        }
        continue;
      }
      lost = LeaseLostReason(opts.node_name, s, keeper.has_value(), absl::Now() - acked,
                             opts.lease_ttl, LeaseTryTimeout());
      if (lost.empty()) {
        if (failing_since == absl::InfinitePast()) {
          failing_since = absl::Now();
          spdlog::warn("lease keeper: refreshing lease {} failed ({}); retrying on a fresh store "
                       "connection every {} until the lease ({}) runs out",
                       lease.load(), s.ToString(), absl::FormatDuration(LeaseTryTimeout()),
                       absl::FormatDuration(opts.lease_ttl));
        }
        keeper.reset();  // its socket may be stuck in TCP's backoff: the next try dials afresh
        wait = std::max(absl::ZeroDuration(), LeaseTryTimeout() - (absl::Now() - t0));  // paced
        continue;
      }
      StopForLostLease(lost, s);
      failing_since = absl::InfinitePast();
      register_failures = 0;
      if (!absl::IsNotFound(s)) keeper.reset();  // NOT_FOUND: the store answers, register now
    }
    absl::Status r = keeper ? RegisterAgain(&*keeper, lost) : s;
    if (r.ok()) {
      lost.clear();
      acked = absl::Now();
      continue;
    }
    ++register_failures;
    wait = RegisterRetryDelay(register_failures);
    if (LogRegisterFailure(register_failures, absl::Now() - logged)) {
      logged = absl::Now();
      spdlog::warn("lease keeper: {} is not registered ({}; its ranks are stopped): {}; try {}, "
                   "the next in {}{}",
                   opts.node_name, lost, r.ToString(), register_failures,
                   absl::FormatDuration(wait),
                   RefusesCredentials(r) ? "; check the daemon's store token (auth_token_file)"
                                         : "");
    }
    keeper.reset();
  }
}

void Daemon::Impl::StopForLostLease(const std::string& why, const absl::Status& cause) {
  lease_lost = true;  // the heartbeat stops writing the node record under the old lease
  int n = 0;
  {
    absl::MutexLock l(&mu);
    for (auto& [k, a] : local) {
      if (a.released) continue;
      a.stop_key_pending = true;  // supervise.cc writes it before reporting an exit
      StopAttempt(&a, why);
      ++n;
    }
  }
  if (RefusesCredentials(cause)) {
    spdlog::error("lease {} of {}: the store refuses this daemon ({}): stopping {} local "
                  "attempt(s); check the daemon's store token; registering again once the store "
                  "accepts it", lease.load(), opts.node_name, cause.ToString(), n);
  } else {
    spdlog::warn("lease {} of {} expired in the store ({}): stopping {} local attempt(s) and "
                 "registering again", lease.load(), opts.node_name, why, n);
  }
}

absl::Status Daemon::Impl::RegisterAgain(store::Client* via, const std::string& why) {
  // The stop keys first: the scheduler then records this reason, whatever it saw of the node.
  // Re-sent on UNAVAILABLE ("outcome unknown" included: a second try finds the key set) or a
  // deadline: each try is bounded by LeaseTryTimeout.
  std::vector<std::pair<std::string, int>> stopped;
  {
    absl::MutexLock l(&mu);
    for (const auto& [k, a] : local) {
      if (a.stop_key_pending) stopped.emplace_back(a.job, a.attempt);
    }
  }
  for (const auto& [job, n] : stopped) {
    absl::Status w;
    for (int tries = 0; tries < 3; ++tries) {
      w = via->CompareSet(keys::Stop(job, n), std::nullopt, why).status();
      if (w.ok() || !(absl::IsUnavailable(w) || absl::IsDeadlineExceeded(w))) break;
    }
    if (!w.ok() && (RefusesCredentials(w) || absl::IsUnavailable(w) ||
                    absl::IsDeadlineExceeded(w))) {
      return base::Annotate(w, absl::StrCat("writing the stop key of ", job, " attempt ", n));
    }
  }
  {
    absl::MutexLock l(&mu);
    for (const auto& [job, n] : stopped) {
      auto it = local.find(absl::StrCat(job, "#", n));
      if (it != local.end()) it->second.stop_key_pending = false;
    }
  }
  // Register only once the stopped workers are gone: the new registration shows this node's
  // devices free, and a new attempt must not be placed on a device its old worker still uses.
  // Any still running are claimed below, so the scheduler sees their devices busy.
  if (!AwaitLocalReleased()) {
    spdlog::warn("lease keeper: local workers still running after kill_grace; registering with "
                 "their devices claimed");
  }
  // Always a new lease: the old one, if the store still holds it (credentials refused for less
  // than lease_ttl, a store restarted from its data directory), goes with whatever it still
  // holds: claims the stopped workers' release could not delete, the node record, the leader key.
  if (absl::Status old = via->RevokeLease(lease.load()); !old.ok() && !absl::IsNotFound(old)) {
    return base::Annotate(old, "revoking the old lease");
  }
  auto granted = via->GrantLease(opts.lease_ttl);
  if (!granted.ok()) return base::Annotate(granted.status(), "granting a new lease");
  const int64_t id = *granted;
  RETURN_IF_ERROR(ClaimHeldDevices(via, id));
  lease = id;
  lease_lost = false;
  Persist();
  absl::Status r = Register(via);
  spdlog::info("{} registered again under lease {}{}", opts.node_name, id,
               r.ok() ? "" : absl::StrCat(" (node record not written yet: ", r.ToString(), ")"));
  return absl::OkStatus();  // the heartbeat writes the node record again within `heartbeat`
}

absl::Status Daemon::Impl::ClaimHeldDevices(store::Client* via, int64_t lease_id) {
  // Under claims_mu: a release (supervise.cc) deletes its claims and marks the attempt released
  // under it too, so a claim written here is never left behind by a release running meanwhile.
  absl::MutexLock c(&claims_mu);
  std::vector<std::pair<std::string, std::string>> held;  // device, job
  {
    absl::MutexLock l(&mu);
    for (const auto& [k, a] : local) {
      if (a.released) continue;
      for (const std::string& d : a.devices) held.emplace_back(d, a.job);
    }
  }
  for (const auto& [device, job] : held) {
    RETURN_IF_ERROR(base::Annotate(
        via->SetWithLease(keys::Alloc(opts.node_name, device), job, lease_id),
        absl::StrCat("claiming device ", device, " still held by a worker of job ", job)));
  }
  return absl::OkStatus();
}

}  // namespace ember::daemon
