// The scheduler's decisions as functions of a snapshot: the restart policy (no-retry reasons,
// max_restarts, backoff), what to do with a RUNNING job's current attempt (success, a rank's
// failure, a lost node), and retention of finished jobs. No store, no processes, no sleeping: the
// daemon reads the store into a snapshot, asks, and writes the outcome (schedule.cc). Time comes
// from an injected base::Clock, so every rule is tested with a FakeClock (scheduler_test.cc).
//
//   Scheduler s(options, base::RealClock());         // borrowed; must outlive s
//   AttemptAction act = s.CheckAttempt(snapshot);     // each pass, for each RUNNING job
//   if (!act.stop_reason.empty()) ... write the stop key ...
//   if (act.kind == AttemptAction::kDecideFailure)
//     ... UpdateRecord(id, [&](Job* j) { s.RecordFailure(j, report); ... });
//
// The free functions are pure and thread-safe. A Scheduler is not thread-safe: one thread (the
// daemon's control thread) owns it. It remembers when it first saw each failing attempt (to wait
// for the ranks to report, at most failure_settle) and when retention last ran.
#ifndef EMBER_RUNTIME_DAEMON_SCHEDULER_H_
#define EMBER_RUNTIME_DAEMON_SCHEDULER_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/jobs.pb.h"
#include "runtime/base/clock.h"
#include "runtime/daemon/placement.h"

namespace ember::daemon {

// SUCCEEDED, FAILED or CANCELLED.
bool IsTerminal(jobs::v1::JobState s);

// What a failed attempt leads to. `job` has the failed attempt last, with its reason, root cause and
// last_step filled in. RESTARTING while attempts_size() <= spec.max_restarts and
// NoRetryReason(job) is empty; FAILED otherwise.
jobs::v1::JobState NextStateAfterFailure(const jobs::v1::Job& job);

// Why a failure must not be retried even with restarts left, or "": exit code 2 (the worker's
// "bad spec or environment"), or the same rank failing the same way (exit code / signal) as in the
// previous attempt without getting past that attempt's last step.
std::string NoRetryReason(const jobs::v1::Job& job);

// Backoff before attempt `next_attempt` (>= 1): initial * 2^(next_attempt-1), at most max.
absl::Duration RestartBackoff(int next_attempt, absl::Duration initial, absl::Duration max);

// Which finished jobs retention forgets now (see DaemonOptions::keep_finished_jobs): every job
// beyond the newest `keep` by end time (ties by id), and every job that ended more than `ttl`
// before `now_ms`. A job's end time is its end_unix_ms, else its submit time.
std::vector<std::string> JobsToForget(const std::vector<jobs::v1::Job>& finished, int keep,
                                      absl::Duration ttl, int64_t now_ms);

// "rank 1 on node-a exited with code 3" / "rank 0 on node-a was killed by signal 9 (SIGKILL)".
std::string DescribeExit(const jobs::v1::RankExit& e);

// A hang is noticed by a healthy rank whose collective timed out, so the first failure names that
// rank, not the one that hung. True when the analyzer's first finding in `verdict` is that other
// ranks (not `failed_rank`) never joined the op: that finding is the root cause.
bool NamesHungRanks(const std::string& verdict, int failed_rank);

// A node of `attempt`'s assignment that is not in `alive` (its lease is gone; the last such in
// assignment order), or "".
std::string LostNode(const jobs::v1::Attempt& attempt, const std::set<std::string>& alive);

// The scheduler's view of the registered nodes: every device, and those a job holds (`allocs`:
// "node/device" -> job).
std::vector<NodeDevices> Snapshot(const std::vector<jobs::v1::Node>& nodes,
                                  const std::map<std::string, std::string>& allocs);
// The gang a job asks for (world size, resources.nodes, resources.devices_per_node).
GangRequest RequestOf(const jobs::v1::Job& job);

struct SchedulerOptions {
  // Attempt k (k >= 1) is placed restart_backoff * 2^(k-1) after attempt k-1 ended, at most
  // restart_backoff_max.
  absl::Duration restart_backoff = absl::Seconds(1);
  absl::Duration restart_backoff_max = absl::Seconds(30);
  // How long to wait for every rank on a live node to report its exit before deciding anyway.
  absl::Duration failure_settle = absl::Seconds(5);
  // Retention (0 / a zero duration = no limit of that kind), at most once per retention_every.
  int keep_finished_jobs = 100;
  absl::Duration finished_job_ttl = absl::Hours(7 * 24);
  absl::Duration retention_every = absl::Seconds(2);
};

// What the store says about a RUNNING job's current attempt.
struct AttemptSnapshot {
  jobs::v1::Job job;                          // the record; the current attempt is last
  std::set<std::string> alive;                // registered nodes (their lease is alive)
  std::optional<jobs::v1::RankExit> failure;  // the failure key: the first rank failing on its own
  std::optional<std::string> stop;            // the stop key, when set
  std::vector<std::optional<jobs::v1::RankExit>> exits;  // exit key per rank (world_size entries)
};

// What to do with that attempt now.
struct AttemptAction {
  enum Kind {
    kRunning,        // nothing yet
    kSucceeded,      // every rank exited 0: MarkSucceeded
    kDrained,        // every rank exited 0 or 76 (checkpointed on a drain request), one 76: MarkDrained
    kFailing,        // failed; waiting for the ranks on live nodes to report (failure_settle)
    kDecideFailure,  // failed and settled: analyse the dumps, then RecordFailure
  };
  Kind kind = kRunning;
  std::string reason;                       // kFailing, kDecideFailure: why the attempt failed
  std::optional<jobs::v1::RankExit> cause;  // the root-cause rank, when a rank failed on its own
  std::string stop_reason;  // non-empty: set the stop key to this now (every rank polls it)
};

// What RecordFailure learned outside the snapshot: the flight-recorder verdict and the failing
// rank's last step.
struct FailureReport {
  std::string reason;
  std::optional<jobs::v1::RankExit> cause;
  std::string verdict;
  int64_t last_step = 0;
};

class Scheduler {
 public:
  Scheduler(SchedulerOptions options, const base::Clock* clock);

  const SchedulerOptions& options() const { return options_; }

  // A PENDING or RESTARTING job may be placed now: its previous attempt gave every device back
  // (!holds_devices) and a RESTARTING job's backoff has passed.
  bool Startable(const jobs::v1::Job& job, bool holds_devices) const;

  // Decides about `s.job`'s current attempt. The first decision wins: a rank's own failure (the
  // failure key), else whatever already set the stop key (a draining node, a cancel, an earlier
  // pass), else a lost node ("node lost: <node>"), else a bad exit once every rank exited. A
  // failing attempt is decided once every rank on a live node reported its exit, or
  // failure_settle after this Scheduler first saw it fail; stop_reason is set on that first pass
  // when nothing set the stop key yet.
  AttemptAction CheckAttempt(const AttemptSnapshot& s);

  // Record mutations, applied inside a compare-and-set of the job record.
  // Places attempt `number` (RUNNING, reason cleared, start time now).
  void StartAttempt(jobs::v1::Job* job, int number, const jobs::v1::Assignment& placed) const;
  // SUCCEEDED, with the current attempt's and the job's end time.
  void MarkSucceeded(jobs::v1::Job* job) const;
  // CANCELLED after a checkpoint-and-stop (Cancel with checkpoint): the reason names it.
  void MarkDrained(jobs::v1::Job* job) const;
  // Ends the current attempt with `r` and moves the job to RESTARTING (restart_unix_ms = now +
  // RestartBackoff; the reason says "(restarting as attempt n in 2s)") or FAILED (the reason says
  // why not retried: NoRetryReason, or "(after n attempts; max_restarts m)").
  void RecordFailure(jobs::v1::Job* job, const FailureReport& r) const;

  // True at most once per retention_every, and never when retention has no limit.
  bool RetentionDue();
  // The finished jobs to forget now (JobsToForget with the configured limits).
  std::vector<std::string> ToForget(const std::vector<jobs::v1::Job>& finished) const;

 private:
  int64_t NowMs() const { return absl::ToUnixMillis(clock_->Now()); }

  const SchedulerOptions options_;
  const base::Clock* const clock_;
  std::map<std::string, absl::Time> failing_since_;  // "<job>#<attempt>" -> first seen failing
  absl::Time last_retention_ = absl::InfinitePast();
};

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_SCHEDULER_H_
