// The scheduler's decisions with a fake clock: restart policy, backoff, no-retry reasons, node
// loss, success and retention. No store, no processes, no sleeping: every expectation is computed
// by hand from the rules in scheduler.h.
#include "runtime/daemon/scheduler.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "runtime/base/clock.h"

namespace ember::daemon {
namespace {

using jobs::v1::RankExit;

TEST_CASE("retention forgets finished jobs beyond the newest N and older than the TTL") {
  auto job = [](const std::string& id, int64_t end_ms) {
    jobs::v1::Job j;
    j.set_id(id);
    j.set_submit_unix_ms(end_ms - 10);
    j.set_end_unix_ms(end_ms);
    return j;
  };
  const int64_t now = 1'000'000'000;
  std::vector<jobs::v1::Job> done = {job("a", now - 5000), job("b", now - 1000),
                                     job("c", now - 3000), job("d", now - 100)};
  auto f = JobsToForget(done, 2, absl::ZeroDuration(), now);  // keeps d, b
  std::sort(f.begin(), f.end());
  REQUIRE(f == std::vector<std::string>{"a", "c"});
  f = JobsToForget(done, 0, absl::Seconds(2), now);  // ended more than 2 s ago
  std::sort(f.begin(), f.end());
  REQUIRE(f == std::vector<std::string>{"a", "c"});
  f = JobsToForget(done, 3, absl::Milliseconds(500), now);
  std::sort(f.begin(), f.end());
  REQUIRE(f == std::vector<std::string>{"a", "b", "c"});
  REQUIRE(JobsToForget(done, 0, absl::ZeroDuration(), now).empty());  // no limits
  jobs::v1::Job never_started;  // cancelled while pending: no end time, the submit time counts
  never_started.set_id("p");
  never_started.set_submit_unix_ms(now - 10'000);
  REQUIRE(JobsToForget({never_started}, 0, absl::Seconds(5), now) == std::vector<std::string>{"p"});
}

jobs::v1::Attempt FailedAttempt(int n, int rank, int code, int sig, int64_t last_step) {
  jobs::v1::Attempt a;
  a.set_number(n);
  a.mutable_root_cause()->set_rank(rank);
  a.mutable_root_cause()->set_exit_code(code);
  a.mutable_root_cause()->set_signal(sig);
  a.set_last_step(last_step);
  return a;
}

TEST_CASE("restart decisions: max_restarts, exit code 2, the same failure twice, node loss") {
  jobs::v1::Job j;
  j.mutable_spec()->set_max_restarts(2);
  *j.add_attempts() = FailedAttempt(0, 1, -1, 9, 30);
  REQUIRE(NextStateAfterFailure(j) == jobs::v1::RESTARTING);
  // Progress since the last failure: the same signal again is retried.
  *j.add_attempts() = FailedAttempt(1, 1, -1, 9, 45);
  REQUIRE(NoRetryReason(j).empty());
  REQUIRE(NextStateAfterFailure(j) == jobs::v1::RESTARTING);
  // Budget spent.
  *j.add_attempts() = FailedAttempt(2, 0, 1, 0, 60);
  REQUIRE(NextStateAfterFailure(j) == jobs::v1::FAILED);

  jobs::v1::Job same;
  same.mutable_spec()->set_max_restarts(10);
  *same.add_attempts() = FailedAttempt(0, 3, 3, 0, 2);
  *same.add_attempts() = FailedAttempt(1, 3, 3, 0, 2);
  REQUIRE(absl::StrContains(NoRetryReason(same), "same way as attempt 0"));
  REQUIRE(NextStateAfterFailure(same) == jobs::v1::FAILED);

  jobs::v1::Job bad;
  bad.mutable_spec()->set_max_restarts(10);
  *bad.add_attempts() = FailedAttempt(0, 0, 2, 0, 0);
  REQUIRE(absl::StrContains(NoRetryReason(bad), "bad spec"));
  REQUIRE(NextStateAfterFailure(bad) == jobs::v1::FAILED);

  jobs::v1::Job lost;  // "node lost" has no root cause: always retryable within the budget
  lost.mutable_spec()->set_max_restarts(1);
  lost.add_attempts()->set_number(0);
  REQUIRE(NextStateAfterFailure(lost) == jobs::v1::RESTARTING);
  lost.add_attempts()->set_number(1);
  REQUIRE(NextStateAfterFailure(lost) == jobs::v1::FAILED);
}

TEST_CASE("restart backoff doubles up to its cap") {
  REQUIRE(RestartBackoff(1, absl::Seconds(1), absl::Seconds(30)) == absl::Seconds(1));
  REQUIRE(RestartBackoff(2, absl::Seconds(1), absl::Seconds(30)) == absl::Seconds(2));
  REQUIRE(RestartBackoff(4, absl::Seconds(1), absl::Seconds(30)) == absl::Seconds(8));
  REQUIRE(RestartBackoff(40, absl::Seconds(1), absl::Seconds(30)) == absl::Seconds(30));
}

// ------------------------------------------------------------------------------------------------
// Scheduler with a fake clock

constexpr int64_t kStartMs = 1'700'000'000'000;  // FakeClock's default epoch

RankExit Exit(int rank, const std::string& node, int code, int sig = 0) {
  RankExit e;
  e.set_rank(rank);
  e.set_node(node);
  e.set_exit_code(code);
  e.set_signal(sig);
  return e;
}

// A RUNNING job "j" whose current attempt `number` has ranks [first, first + n) on each node.
jobs::v1::Job RunningJob(int max_restarts, const std::vector<std::pair<std::string, int>>& nodes,
                         int number = 0) {
  jobs::v1::Job j;
  j.set_id("j");
  j.set_state(jobs::v1::RUNNING);
  j.mutable_spec()->set_max_restarts(max_restarts);
  int rank = 0;
  for (int k = 0; k < number; ++k) j.add_attempts()->set_number(k);  // earlier attempts: node lost
  jobs::v1::Attempt* a = j.add_attempts();
  a->set_number(number);
  for (size_t i = 0; i < nodes.size(); ++i) {
    jobs::v1::NodeAssignment* na = a->mutable_assignment()->add_nodes();
    na->set_node(nodes[i].first);
    na->set_node_rank(static_cast<int>(i));
    na->set_first_rank(rank);
    for (int d = 0; d < nodes[i].second; ++d) na->add_devices("cpu:" + std::to_string(d));
    rank += nodes[i].second;
  }
  j.set_world_size(rank);
  a->mutable_assignment()->set_world_size(rank);
  return j;
}

AttemptSnapshot SnapshotOf(const jobs::v1::Job& j, std::set<std::string> alive) {
  AttemptSnapshot s;
  s.job = j;
  s.alive = std::move(alive);
  s.exits.resize(j.world_size());
  return s;
}

SchedulerOptions Opts() {
  SchedulerOptions o;
  o.restart_backoff = absl::Seconds(1);
  o.restart_backoff_max = absl::Seconds(30);
  o.failure_settle = absl::Seconds(5);
  return o;
}

TEST_CASE("scheduler: a rank's failure stops the gang, settles, then restarts after the backoff") {
  base::FakeClock clock;
  Scheduler s(Opts(), &clock);
  jobs::v1::Job j = RunningJob(/*max_restarts=*/2, {{"node-a", 2}});
  AttemptSnapshot snap = SnapshotOf(j, {"node-a"});
  REQUIRE(s.CheckAttempt(snap).kind == AttemptAction::kRunning);

  snap.failure = Exit(1, "node-a", 3);
  snap.exits[1] = Exit(1, "node-a", 3);
  AttemptAction act = s.CheckAttempt(snap);
  REQUIRE(act.kind == AttemptAction::kFailing);  // rank 0 on a live node has not reported yet
  REQUIRE(act.reason == "rank 1 on node-a exited with code 3");
  REQUIRE(act.stop_reason == act.reason);  // first pass: stop every rank
  REQUIRE(act.cause.has_value());
  REQUIRE(act.cause->rank() == 1);

  snap.stop = act.stop_reason;  // as the daemon wrote it
  clock.Advance(absl::Milliseconds(4999));
  act = s.CheckAttempt(snap);
  REQUIRE(act.kind == AttemptAction::kFailing);
  REQUIRE(act.stop_reason.empty());  // set once
  clock.Advance(absl::Milliseconds(1));  // failure_settle after it was first seen: decide anyway
  act = s.CheckAttempt(snap);
  REQUIRE(act.kind == AttemptAction::kDecideFailure);
  REQUIRE(act.reason == "rank 1 on node-a exited with code 3");

  const int64_t now = kStartMs + 5000;
  s.RecordFailure(&j, FailureReport{act.reason, act.cause, "", 10});
  REQUIRE(j.state() == jobs::v1::RESTARTING);
  REQUIRE(j.reason() == "rank 1 on node-a exited with code 3 (restarting as attempt 1 in 1s)");
  REQUIRE(j.root_cause().rank() == 1);
  const jobs::v1::Attempt& a = j.attempts(0);
  REQUIRE(a.reason() == "rank 1 on node-a exited with code 3");
  REQUIRE(a.last_step() == 10);
  REQUIRE(a.end_unix_ms() == now);
  REQUIRE(a.restart_unix_ms() == now + 1000);
  REQUIRE(j.end_unix_ms() == 0);

  REQUIRE_FALSE(s.Startable(j, /*holds_devices=*/false));
  clock.Advance(absl::Milliseconds(999));
  REQUIRE_FALSE(s.Startable(j, false));
  clock.Advance(absl::Milliseconds(1));
  REQUIRE(s.Startable(j, false));
  REQUIRE_FALSE(s.Startable(j, /*holds_devices=*/true));  // the old attempt's devices first

  s.StartAttempt(&j, 1, j.attempts(0).assignment());
  REQUIRE(j.state() == jobs::v1::RUNNING);
  REQUIRE(j.reason().empty());
  REQUIRE(j.attempts_size() == 2);
  REQUIRE(j.attempts(1).number() == 1);
  REQUIRE(j.attempts(1).start_unix_ms() == kStartMs + 6000);
}

TEST_CASE("scheduler: the attempt is decided as soon as every rank on a live node reported") {
  base::FakeClock clock;
  Scheduler s(Opts(), &clock);
  jobs::v1::Job j = RunningJob(2, {{"node-a", 2}});
  AttemptSnapshot snap = SnapshotOf(j, {"node-a"});
  snap.failure = Exit(0, "node-a", 0, 9);
  snap.exits[0] = Exit(0, "node-a", 0, 9);
  snap.exits[1] = Exit(1, "node-a", 75);  // obeyed the stop key
  AttemptAction act = s.CheckAttempt(snap);
  REQUIRE(act.kind == AttemptAction::kDecideFailure);
  REQUIRE(act.reason == "rank 0 on node-a was killed by signal 9 (SIGKILL)");
  REQUIRE(act.stop_reason == act.reason);
}

TEST_CASE("scheduler: max_restarts exhausted fails the job naming the count") {
  base::FakeClock clock;
  Scheduler s(Opts(), &clock);
  jobs::v1::Job j = RunningJob(/*max_restarts=*/2, {{"node-a", 1}}, /*number=*/2);
  REQUIRE(j.attempts_size() == 3);
  s.RecordFailure(&j, FailureReport{"rank 0 on node-a exited with code 1",
                                    Exit(0, "node-a", 1), "", 7});
  REQUIRE(j.state() == jobs::v1::FAILED);
  REQUIRE(j.reason() ==
          "rank 0 on node-a exited with code 1 (after 3 attempts; max_restarts 2)");
  REQUIRE(j.end_unix_ms() == kStartMs);
  REQUIRE(j.attempts(2).restart_unix_ms() == 0);

  jobs::v1::Job once = RunningJob(/*max_restarts=*/0, {{"node-a", 1}});
  s.RecordFailure(&once, FailureReport{"rank 0 on node-a exited with code 1",
                                       Exit(0, "node-a", 1), "", 0});
  REQUIRE(once.state() == jobs::v1::FAILED);
  REQUIRE(once.reason() == "rank 0 on node-a exited with code 1");  // no restarts were asked for
}

TEST_CASE("scheduler: exit code 2 and the same failure twice are not retried") {
  base::FakeClock clock;
  Scheduler s(Opts(), &clock);
  jobs::v1::Job bad = RunningJob(10, {{"node-a", 1}});
  s.RecordFailure(&bad, FailureReport{"rank 0 on node-a exited with code 2",
                                      Exit(0, "node-a", 2), "", 0});
  REQUIRE(bad.state() == jobs::v1::FAILED);
  REQUIRE(bad.reason() == "rank 0 on node-a exited with code 2 (exit code 2 is a bad spec or "
                          "environment: not retried)");

  jobs::v1::Job twice = RunningJob(10, {{"node-a", 1}});
  s.RecordFailure(&twice, FailureReport{"r", Exit(0, "node-a", 3), "", 4});
  REQUIRE(twice.state() == jobs::v1::RESTARTING);
  s.StartAttempt(&twice, 1, twice.attempts(0).assignment());
  s.RecordFailure(&twice, FailureReport{"r", Exit(0, "node-a", 3), "", 4});  // no further
  REQUIRE(twice.state() == jobs::v1::FAILED);
  REQUIRE(twice.reason() == "r (failed the same way as attempt 0 without getting past step 4: a "
                            "spec or code error is not retried)");
}

TEST_CASE("scheduler: backoff doubles per attempt up to its cap") {
  base::FakeClock clock;
  SchedulerOptions o = Opts();
  o.restart_backoff_max = absl::Seconds(5);
  Scheduler s(o, &clock);
  jobs::v1::Job j = RunningJob(10, {{"node-a", 1}});
  const int64_t expected_ms[] = {1000, 2000, 4000, 5000, 5000};
  for (int k = 0; k < 5; ++k) {
    // Each failure gets further than the last, so it stays retryable.
    s.RecordFailure(&j, FailureReport{"r", Exit(0, "node-a", 1), "", 10 * (k + 1)});
    REQUIRE(j.state() == jobs::v1::RESTARTING);
    const int64_t now = absl::ToUnixMillis(clock.Now());
    REQUIRE(j.attempts(k).restart_unix_ms() - now == expected_ms[k]);
    REQUIRE(absl::StrContains(j.reason(), absl::StrCat("(restarting as attempt ", k + 1, " in ",
                                                       expected_ms[k] / 1000, "s)")));
    clock.Advance(absl::Milliseconds(expected_ms[k]));
    REQUIRE(s.Startable(j, false));
    s.StartAttempt(&j, k + 1, j.attempts(k).assignment());
  }
}

TEST_CASE("scheduler: a node whose lease is gone fails the attempt naming the node") {
  base::FakeClock clock;
  Scheduler s(Opts(), &clock);
  jobs::v1::Job j = RunningJob(/*max_restarts=*/1, {{"node-a", 2}, {"node-b", 2}});
  REQUIRE(LostNode(j.attempts(0), {"node-a", "node-b"}).empty());
  REQUIRE(LostNode(j.attempts(0), {"node-a"}) == "node-b");
  AttemptSnapshot snap = SnapshotOf(j, {"node-a"});  // node-b's lease expired mid-attempt
  AttemptAction act = s.CheckAttempt(snap);
  REQUIRE(act.kind == AttemptAction::kFailing);  // ranks 0, 1 on node-a still running
  REQUIRE(act.reason == "node lost: node-b");
  REQUIRE(act.stop_reason == "node lost: node-b");
  REQUIRE_FALSE(act.cause.has_value());
  snap.stop = act.stop_reason;

  // The live node's ranks obey the stop key; ranks 2 and 3 on node-b never report, and are not
  // waited for.
  snap.exits[0] = Exit(0, "node-a", 75);
  snap.exits[1] = Exit(1, "node-a", 75);
  act = s.CheckAttempt(snap);
  REQUIRE(act.kind == AttemptAction::kDecideFailure);
  REQUIRE(act.reason == "node lost: node-b");
  s.RecordFailure(&j, FailureReport{act.reason, act.cause, "", 0});
  REQUIRE(j.state() == jobs::v1::RESTARTING);  // a lost node is always retryable in the budget
  REQUIRE(j.reason() == "node lost: node-b (restarting as attempt 1 in 1s)");
  REQUIRE_FALSE(j.has_root_cause());

  // Attempt 1 loses a node too: the budget (max_restarts 1) is spent.
  clock.Advance(absl::Seconds(1));
  s.StartAttempt(&j, 1, j.attempts(0).assignment());
  snap = SnapshotOf(j, {"node-b"});
  act = s.CheckAttempt(snap);
  REQUIRE(act.reason == "node lost: node-a");
  clock.Advance(absl::Seconds(5));  // node-b's ranks never report: decided after failure_settle
  act = s.CheckAttempt(snap);
  REQUIRE(act.kind == AttemptAction::kDecideFailure);
  s.RecordFailure(&j, FailureReport{act.reason, act.cause, "", 0});
  REQUIRE(j.state() == jobs::v1::FAILED);
  REQUIRE(j.reason() == "node lost: node-a (after 2 attempts; max_restarts 1)");
}

TEST_CASE("scheduler: the first decision wins over a lost node") {
  base::FakeClock clock;
  Scheduler s(Opts(), &clock);
  jobs::v1::Job j = RunningJob(3, {{"node-a", 1}, {"node-b", 1}});
  AttemptSnapshot snap = SnapshotOf(j, {"node-a"});
  snap.stop = "node node-b draining";  // written by node-b before its lease went
  AttemptAction act = s.CheckAttempt(snap);
  REQUIRE(act.reason == "node node-b draining");
  REQUIRE(act.stop_reason.empty());  // already set
  snap.failure = Exit(0, "node-a", 4);  // a rank's own failure wins over both
  act = s.CheckAttempt(snap);
  REQUIRE(act.reason == "rank 0 on node-a exited with code 4");
  REQUIRE(act.cause->exit_code() == 4);
}

TEST_CASE("scheduler: every rank exiting 0 succeeds; a bad exit without a failure key fails") {
  base::FakeClock clock;
  Scheduler s(Opts(), &clock);
  jobs::v1::Job j = RunningJob(0, {{"node-a", 2}});
  AttemptSnapshot snap = SnapshotOf(j, {"node-a"});
  snap.exits[0] = Exit(0, "node-a", 0);
  REQUIRE(s.CheckAttempt(snap).kind == AttemptAction::kRunning);  // rank 1 still running
  snap.exits[1] = Exit(1, "node-a", 0);
  REQUIRE(s.CheckAttempt(snap).kind == AttemptAction::kSucceeded);
  clock.Advance(absl::Milliseconds(250));
  s.MarkSucceeded(&j);
  REQUIRE(j.state() == jobs::v1::SUCCEEDED);
  REQUIRE(j.end_unix_ms() == kStartMs + 250);
  REQUIRE(j.attempts(0).end_unix_ms() == kStartMs + 250);

  snap.exits[1] = Exit(1, "node-a", 6);  // e.g. its failure key write was lost
  AttemptAction act = s.CheckAttempt(snap);
  REQUIRE(act.kind == AttemptAction::kDecideFailure);
  REQUIRE(act.reason == "rank 1 on node-a exited with code 6");
  REQUIRE(act.cause->rank() == 1);
}

TEST_CASE("scheduler: ranks that checkpointed on a drain request (exit 76) end the job CANCELLED") {
  base::FakeClock clock;
  Scheduler s(Opts(), &clock);
  jobs::v1::Job j = RunningJob(0, {{"node-a", 2}});
  AttemptSnapshot snap = SnapshotOf(j, {"node-a"});
  snap.exits[0] = Exit(0, "node-a", 76);
  REQUIRE(s.CheckAttempt(snap).kind == AttemptAction::kRunning);  // rank 1 still running
  snap.exits[1] = Exit(1, "node-a", 76);
  REQUIRE(s.CheckAttempt(snap).kind == AttemptAction::kDrained);
  snap.exits[1] = Exit(1, "node-a", 0);  // the drained step was the last one for rank 1
  REQUIRE(s.CheckAttempt(snap).kind == AttemptAction::kDrained);
  s.MarkDrained(&j);
  REQUIRE(j.state() == jobs::v1::CANCELLED);
  REQUIRE(j.reason().find("after a checkpoint") != std::string::npos);
  snap.exits[1] = Exit(1, "node-a", 1);  // a real failure beside a drained rank is a failure
  REQUIRE(s.CheckAttempt(snap).kind == AttemptAction::kDecideFailure);
}

TEST_CASE("scheduler: a hang verdict leads the reason; another verdict follows it") {
  base::FakeClock clock;
  Scheduler s(Opts(), &clock);
  jobs::v1::Job j = RunningJob(0, {{"node-a", 2}});
  s.RecordFailure(&j, FailureReport{"rank 0 on node-a exited with code 1", Exit(0, "node-a", 1),
                                    "rank 1 never joined allreduce #7; 2 dumps", 0});
  REQUIRE(j.reason() == "rank 1 never joined allreduce #7; 2 dumps (flight recorder; noticed "
                        "first: rank 0 on node-a exited with code 1)");
  REQUIRE(j.attempts(0).verdict() == "rank 1 never joined allreduce #7; 2 dumps");
  REQUIRE(NamesHungRanks("ranks 1, 3 never joined allreduce #7", 0));
  REQUIRE_FALSE(NamesHungRanks("ranks 1, 3 never joined allreduce #7", 3));  // names the failed one

  jobs::v1::Job k = RunningJob(0, {{"node-a", 2}});
  s.RecordFailure(&k, FailureReport{"rank 1 on node-a exited with code 1", Exit(1, "node-a", 1),
                                    "rank 1 never joined allreduce #7", 0});
  REQUIRE(k.reason() ==
          "rank 1 on node-a exited with code 1; flight recorder: rank 1 never joined allreduce #7");
}

TEST_CASE("scheduler: retention runs at most every 2 s and uses the clock's time") {
  base::FakeClock clock;
  SchedulerOptions o = Opts();
  o.keep_finished_jobs = 0;
  o.finished_job_ttl = absl::Seconds(10);
  Scheduler s(o, &clock);
  REQUIRE(s.RetentionDue());
  clock.Advance(absl::Milliseconds(1999));
  REQUIRE_FALSE(s.RetentionDue());
  clock.Advance(absl::Milliseconds(1));
  REQUIRE(s.RetentionDue());
  REQUIRE_FALSE(s.RetentionDue());

  jobs::v1::Job done;
  done.set_id("done");
  done.set_end_unix_ms(absl::ToUnixMillis(clock.Now()));
  REQUIRE(s.ToForget({done}).empty());
  clock.Advance(absl::Milliseconds(10'000));
  REQUIRE(s.ToForget({done}).empty());  // exactly the TTL: kept
  clock.Advance(absl::Milliseconds(1));
  REQUIRE(s.ToForget({done}) == std::vector<std::string>{"done"});

  SchedulerOptions off = Opts();
  off.keep_finished_jobs = 0;
  off.finished_job_ttl = absl::ZeroDuration();
  Scheduler never(off, &clock);
  REQUIRE_FALSE(never.RetentionDue());
}

}  // namespace
}  // namespace ember::daemon
