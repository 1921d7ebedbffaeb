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
// A lease found expired (the store answers NOT_FOUND: it was unreachable longer than lease_ttl, so
// the node's keys and device claims are gone and the scheduler may already have restarted its
// jobs elsewhere) is a lost node, every time: this node's running attempts get the stop key
// "node lost: <node>" (the reason the scheduler records; first writer wins), their local workers
// are stopped (SIGTERM: they dump their flight recorders, then SIGKILL after kill_grace), and once
// they are reaped and their devices released (at most kill_grace + 3 s) the node registers again
// under a new lease, so no new attempt is placed on a device an old worker still holds. Workers that keep running meanwhile cannot write: the
// restarted attempt fences them off (schedule.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/keys.h"
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
  absl::Time failing_since = absl::InfinitePast();  // first failed try of the current outage
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
    if (keeper) s = keeper->RefreshLease(lease.load());
    if (absl::IsNotFound(s) && keeper) {  // (a failed dial is never a lost lease)
      LeaseLost(&*keeper);
      failing_since = absl::InfinitePast();
      continue;
    }
    if (s.ok()) {
      if (failing_since != absl::InfinitePast()) {
        spdlog::info("lease keeper: the store answers again after {:.1f} s; lease {} kept",
                     absl::ToDoubleSeconds(absl::Now() - failing_since), lease.load());
        failing_since = absl::InfinitePast();
      }
      continue;
    }
    if (failing_since == absl::InfinitePast()) {
      failing_since = absl::Now();
      spdlog::warn("lease keeper: refreshing lease {} failed ({}); retrying on a fresh store "
                   "connection every {} until the lease ({}) runs out",
                   lease.load(), s.ToString(), absl::FormatDuration(LeaseTryTimeout()),
                   absl::FormatDuration(opts.lease_ttl));
    }
    keeper.reset();  // its socket may be stuck in TCP's backoff: the next try dials afresh
    wait = std::max(absl::ZeroDuration(), LeaseTryTimeout() - (absl::Now() - t0));  // paced
  }
}

void Daemon::Impl::LeaseLost(store::Client* via) {
  const std::string why = "node lost: " + opts.node_name;
  std::vector<std::pair<std::string, int>> running;
  {
    absl::MutexLock l(&mu);
    for (const auto& [k, a] : local) {
      if (!a.released) running.emplace_back(a.job, a.attempt);
    }
  }
  spdlog::warn("lease {} of {} expired in the store (unreachable longer than the lease, {}): "
               "stopping {} local attempt(s) and registering again",
               lease.load(), opts.node_name, absl::FormatDuration(opts.lease_ttl), running.size());
  // The stop key first: the scheduler then records this reason, whatever it saw of the node.
  // Re-sent on UNAVAILABLE ("outcome unknown" included: a second try finds the key set) or a
  // deadline: each try is bounded by LeaseTryTimeout.
  for (const auto& [job, n] : running) {
    for (int tries = 0; tries < 3; ++tries) {
      auto r = via->CompareSet(keys::Stop(job, n), std::nullopt, why);
      if (r.ok() || !(absl::IsUnavailable(r.status()) || absl::IsDeadlineExceeded(r.status()))) {
        break;
      }
    }
  }
  {
    absl::MutexLock l(&mu);
    for (auto& [k, a] : local) {
      if (!a.released) StopAttempt(&a, why);
    }
  }
  // Register only once the stopped workers are gone: the new registration shows this node's
  // devices free, and a new attempt must not be placed on a device its old worker still uses.
  if (!AwaitLocalReleased()) {
    spdlog::warn("lease keeper: local workers still running after kill_grace; registering anyway");
  }
  auto id = via->GrantLease(opts.lease_ttl);
  if (!id.ok()) {
    spdlog::warn("lease keeper: granting a new lease failed ({}); trying again",
                 id.status().ToString());
    return;  // the next refresh of the old lease is NOT_FOUND again: back here
  }
  lease = *id;
  Persist();
  absl::Status r = Register(via);
  spdlog::info("{} registered again under lease {}{}", opts.node_name, *id,
               r.ok() ? "" : absl::StrCat(" (node record not written yet: ", r.ToString(), ")"));
}

}  // namespace ember::daemon
