#include "runtime/daemon/scheduler.h"

#include <string.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ember::daemon {

using jobs::v1::Job;
using jobs::v1::JobState;
using jobs::v1::RankExit;

bool IsTerminal(JobState s) {
  return s == jobs::v1::SUCCEEDED || s == jobs::v1::FAILED || s == jobs::v1::CANCELLED;
}

std::string NoRetryReason(const Job& job) {
  const int n = job.attempts_size();
  if (n == 0) return "";
  const jobs::v1::Attempt& cur = job.attempts(n - 1);
  if (!cur.has_root_cause()) return "";  // node lost, or stopped from outside: always retryable
  const RankExit& c = cur.root_cause();
  if (c.signal() == 0 && c.exit_code() == 2) {
    return "exit code 2 is a bad spec or environment: not retried";
  }
  if (n < 2) return "";
  const jobs::v1::Attempt& prev = job.attempts(n - 2);
  if (!prev.has_root_cause()) return "";
  const RankExit& p = prev.root_cause();
  if (p.rank() == c.rank() && p.exit_code() == c.exit_code() && p.signal() == c.signal() &&
      cur.last_step() <= prev.last_step()) {
    return absl::StrCat("failed the same way as attempt ", prev.number(),
                        " without getting past step ", prev.last_step(),
                        ": a spec or code error is not retried");
  }
  return "";
}

JobState NextStateAfterFailure(const Job& job) {
  if (job.attempts_size() > job.spec().max_restarts()) return jobs::v1::FAILED;
  if (!NoRetryReason(job).empty()) return jobs::v1::FAILED;
  return jobs::v1::RESTARTING;
}

absl::Duration RestartBackoff(int next_attempt, absl::Duration initial, absl::Duration max) {
  absl::Duration d = initial;
  for (int i = 1; i < next_attempt && d < max; ++i) d *= 2;
  return std::min(d, max);
}

std::vector<std::string> JobsToForget(const std::vector<Job>& finished, int keep,
                                      absl::Duration ttl, int64_t now_ms) {
  auto end = [](const Job& j) { return j.end_unix_ms() > 0 ? j.end_unix_ms() : j.submit_unix_ms(); };
  std::vector<const Job*> order;
  for (const Job& j : finished) order.push_back(&j);
  std::sort(order.begin(), order.end(), [&](const Job* a, const Job* b) {
    return end(*a) != end(*b) ? end(*a) > end(*b) : a->id() > b->id();
  });
  std::vector<std::string> out;
  const int64_t ttl_ms = absl::ToInt64Milliseconds(ttl);
  for (size_t i = 0; i < order.size(); ++i) {
    const bool too_many = keep > 0 && i >= static_cast<size_t>(keep);
    const bool too_old = ttl_ms > 0 && now_ms - end(*order[i]) > ttl_ms;
    if (too_many || too_old) out.push_back(order[i]->id());
  }
  return out;
}

std::string DescribeExit(const RankExit& e) {
  std::string where = absl::StrCat("rank ", e.rank(), e.node().empty() ? "" : " on ", e.node());
  if (e.oom_killed()) {
    return absl::StrCat(where, " ran out of memory: killed by the kernel's OOM killer (signal ",
                        e.signal(), "); lower batch_size, the model size or ranks per node");
  }
  if (e.signal() != 0) {
    const char* name = sigabbrev_np(e.signal());
    return absl::StrCat(where, " was killed by signal ", e.signal(),
                        name ? absl::StrCat(" (SIG", name, ")") : "");
  }
  if (e.exit_code() == 75) return absl::StrCat(where, " stopped on request (exit code 75)");
  return absl::StrCat(where, " exited with code ", e.exit_code());
}

bool NamesHungRanks(const std::string& verdict, int failed_rank) {
  const std::string first = verdict.substr(0, verdict.find("; "));
  const size_t at = first.find(" never joined ");
  if (at == std::string::npos) return false;
  absl::string_view who(first.data(), at);  // "rank 1" or "ranks 1, 3"
  if (!absl::ConsumePrefix(&who, "ranks ") && !absl::ConsumePrefix(&who, "rank ")) return false;
  for (absl::string_view r : absl::StrSplit(who, ", ")) {
    int v = -1;
    if (!absl::SimpleAtoi(r, &v) || v == failed_rank) return false;
  }
  return true;
}

std::string LostNode(const jobs::v1::Attempt& attempt, const std::set<std::string>& alive) {
  std::string lost;
  for (const auto& na : attempt.assignment().nodes()) {
    if (!alive.count(na.node())) lost = na.node();
  }
  return lost;
}

std::vector<NodeDevices> Snapshot(const std::vector<jobs::v1::Node>& nodes,
                                  const std::map<std::string, std::string>& allocs) {
  std::vector<NodeDevices> out;
  for (const auto& n : nodes) {
    NodeDevices nd;
    nd.name = n.name();
    nd.address = n.address();
    nd.draining = n.draining();
    for (const auto& d : n.devices()) {
      nd.devices.push_back(d.id());
      if (allocs.count(absl::StrCat(n.name(), "/", d.id()))) nd.busy.insert(d.id());
    }
    out.push_back(std::move(nd));
  }
  return out;
}

GangRequest RequestOf(const Job& job) {
  return GangRequest{job.world_size(), job.spec().resources().nodes(),
                     job.spec().resources().devices_per_node()};
}

// ------------------------------------------------------------------------------------------------
// Scheduler

Scheduler::Scheduler(SchedulerOptions options, const base::Clock* clock)
    : options_(std::move(options)), clock_(clock) {}

bool Scheduler::Startable(const Job& job, bool holds_devices) const {
  if (holds_devices) return false;
  return !(job.state() == jobs::v1::RESTARTING && job.attempts_size() > 0 &&
           NowMs() < job.attempts(job.attempts_size() - 1).restart_unix_ms());
}

AttemptAction Scheduler::CheckAttempt(const AttemptSnapshot& s) {
  const Job& job = s.job;
  const jobs::v1::Attempt& at = job.attempts(job.attempts_size() - 1);
  const std::string lost = LostNode(at, s.alive);
  std::set<int> ranks_on_live_nodes;
  for (const auto& na : at.assignment().nodes()) {
    if (!s.alive.count(na.node())) continue;
    for (int i = 0; i < na.devices_size(); ++i) ranks_on_live_nodes.insert(na.first_rank() + i);
  }
  // Exit code 76 (ember-worker's kExitDrained): the rank saved the checkpoint of the step every
  // rank agreed on after a drain request, and stopped; not a failure.
  constexpr int kDrainedExit = 76;
  bool all = true, all_zero = true, settled = true, any_drained = false;
  RankExit first_bad;
  for (int r = 0; r < job.world_size(); ++r) {
    const std::optional<RankExit>* e = r < static_cast<int>(s.exits.size()) ? &s.exits[r] : nullptr;
    if (e == nullptr || !e->has_value()) {
      all = false;
      if (ranks_on_live_nodes.count(r)) settled = false;
      continue;
    }
    if ((*e)->signal() == 0 && (*e)->exit_code() == kDrainedExit) {
      any_drained = true;
      continue;
    }
    if ((*e)->exit_code() != 0 || (*e)->signal() != 0) {
      if (all_zero) first_bad = **e;
      all_zero = false;
    }
  }
  AttemptAction act;
  if (s.failure) {
    act.cause = *s.failure;
    act.reason = DescribeExit(*act.cause);
  } else if (s.stop && !s.stop->empty()) {
    act.reason = *s.stop;
  } else if (!lost.empty()) {
    act.reason = "node lost: " + lost;
  } else if (all && !all_zero) {
    act.cause = first_bad;
    act.reason = DescribeExit(first_bad);
  }
  const std::string key = absl::StrCat(job.id(), "#", at.number());
  if (act.reason.empty()) {
    failing_since_.erase(key);
    act.kind = !all ? AttemptAction::kRunning : any_drained ? AttemptAction::kDrained : AttemptAction::kSucceeded;
    return act;
  }
  // Stop every rank now (they poll the stop key); decide once they have all reported (their
  // flight recorders are dumped before they exit), or after failure_settle.
  const absl::Time now = clock_->Now();
  auto [it, first_seen] = failing_since_.emplace(key, now);
  if (first_seen && !s.stop) act.stop_reason = act.reason;
  if (!settled && now - it->second < options_.failure_settle) {
    act.kind = AttemptAction::kFailing;
    return act;
  }
  failing_since_.erase(it);
  act.kind = AttemptAction::kDecideFailure;
  return act;
}

void Scheduler::StartAttempt(Job* j, int number, const jobs::v1::Assignment& placed) const {
  j->set_state(jobs::v1::RUNNING);
  j->set_reason("");
  jobs::v1::Attempt* a = j->add_attempts();
  a->set_number(number);
  *a->mutable_assignment() = placed;
  a->set_start_unix_ms(NowMs());
}

void Scheduler::MarkSucceeded(Job* j) const {
  const int64_t now = NowMs();
  j->set_state(jobs::v1::SUCCEEDED);
  j->mutable_attempts(j->attempts_size() - 1)->set_end_unix_ms(now);
  j->set_end_unix_ms(now);
}

void Scheduler::MarkDrained(Job* j) const {
  const int64_t now = NowMs();
  j->set_state(jobs::v1::CANCELLED);
  j->set_reason("cancelled after a checkpoint (cancel --checkpoint): resubmit with the same id, or requeue, to resume");
  j->mutable_attempts(j->attempts_size() - 1)->set_end_unix_ms(now);
  j->set_end_unix_ms(now);
}

void Scheduler::RecordFailure(Job* j, const FailureReport& r) const {
  const int64_t now = NowMs();
  const bool hang = NamesHungRanks(r.verdict, r.cause ? r.cause->rank() : -1);
  std::string full = r.verdict.empty() ? r.reason
                     : hang ? absl::StrCat(r.verdict, " (flight recorder; noticed first: ", r.reason, ")")
                            : absl::StrCat(r.reason, "; flight recorder: ", r.verdict);
  auto* a = j->mutable_attempts(j->attempts_size() - 1);
  a->set_reason(full);
  a->set_verdict(r.verdict);
  a->set_last_step(r.last_step);
  if (r.cause) {
    *a->mutable_root_cause() = *r.cause;
    *j->mutable_root_cause() = *r.cause;
  }
  a->set_end_unix_ms(now);
  const JobState next = NextStateAfterFailure(*j);
  j->set_state(next);
  std::string why = full;
  if (next == jobs::v1::FAILED) {
    std::string no_retry = NoRetryReason(*j);
    if (!no_retry.empty()) {
      absl::StrAppend(&why, " (", no_retry, ")");
    } else if (j->spec().max_restarts() > 0) {
      absl::StrAppend(&why, " (after ", j->attempts_size(), " attempts; max_restarts ",
                      j->spec().max_restarts(), ")");
    }
    j->set_end_unix_ms(now);
  } else {
    const absl::Duration wait = RestartBackoff(j->attempts_size(), options_.restart_backoff,
                                               options_.restart_backoff_max);
    a->set_restart_unix_ms(now + absl::ToInt64Milliseconds(wait));
    absl::StrAppend(&why, " (restarting as attempt ", j->attempts_size(), " in ",
                    absl::FormatDuration(wait), ")");
  }
  j->set_reason(why);
}

bool Scheduler::RetentionDue() {
  if (options_.keep_finished_jobs <= 0 && options_.finished_job_ttl <= absl::ZeroDuration()) {
    return false;
  }
  const absl::Time now = clock_->Now();
  if (now - last_retention_ < options_.retention_every) return false;
  last_retention_ = now;
  return true;
}

std::vector<std::string> Scheduler::ToForget(const std::vector<Job>& finished) const {
  return JobsToForget(finished, options_.keep_finished_jobs, options_.finished_job_ttl, NowMs());
}

}  // namespace ember::daemon
