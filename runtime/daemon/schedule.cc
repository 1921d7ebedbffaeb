// The leader's scheduling pass: reads the store into snapshots, asks the Scheduler
// (scheduler.h: placement, restarts, node loss, retention) and writes its decisions back, every
// record change by compare-and-set. Runs on the control thread; never takes Impl::mu.
#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/placement.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

using jobs::v1::RankExit;

void Daemon::Impl::Schedule() {
  auto active = store->ListKeys("active/");
  if (!active.ok()) return;
  std::vector<Job> jobs;
  for (const std::string& k : *active) {
    const std::string id = k.substr(strlen("active/"));
    auto rec = ReadRecord(id);  // a forged id or record is refused (records.cc), never placed
    if (rec.ok()) jobs.push_back(rec->first);
    else WarnRefusedRecord(id, rec.status());
  }
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) {
    return a.submit_unix_ms() != b.submit_unix_ms() ? a.submit_unix_ms() < b.submit_unix_ms()
                                                    : a.id() < b.id();
  });
  auto nodes = ReadNodes();
  auto allocs = ReadAllocs();
  if (!nodes.ok() || !allocs.ok()) return;
  std::set<std::string> alive;
  for (const auto& n : *nodes) alive.insert(n.name());
  std::set<std::string> jobs_holding;
  for (const auto& [dev, job] : *allocs) jobs_holding.insert(job);

  // Running and finished jobs first; the queue (PENDING, RESTARTING) in FIFO order after.
  std::vector<QueuedJob> queue;
  std::map<std::string, const Job*> queued;
  for (const Job& job : jobs) {
    const std::string& id = job.id();
    if (job.state() == jobs::v1::PENDING || job.state() == jobs::v1::RESTARTING) {
      QueuedJob q{id, job.device_type(), RequestOf(job)};
      // Not yet: the previous attempt's devices are not released, or the restart backs off.
      // Either way the job keeps its place (and its reservation) in the queue.
      q.startable = scheduler.Startable(job, jobs_holding.count(id) > 0);
      queue.push_back(std::move(q));
      queued[id] = &job;
    } else if (job.state() == jobs::v1::RUNNING) {
      CheckAttempt(job, alive);
    } else if (IsTerminal(job.state()) && !jobs_holding.count(id)) {
      (void)store->Delete(keys::Active(id));  // finished and every device given back
    }
  }

  for (const QueueDecision& d : PlanQueue(queue, Snapshot(*nodes, *allocs))) {
    const std::string& id = d.id;
    const Job& job = *queued[id];
    if (!d.placement) {
      // Say why it waits (PENDING only: a RESTARTING job keeps its failure and restart reason).
      if (job.state() == jobs::v1::PENDING && !d.waiting.empty() && job.reason() != d.waiting) {
        (void)UpdateRecord(id, [&](Job* j) {
          if (j->state() != jobs::v1::PENDING || j->reason() == d.waiting) return false;
          j->set_reason(d.waiting);
          return true;
        });
      }
      continue;
    }
    const jobs::v1::Assignment& placed = *d.placement;
    // Claim the devices under each node's lease (they vanish with a lost node), then flip the
    // record; on a lost race give them back.
    std::vector<std::string> claimed;
    bool ok = true;
    for (const auto& na : placed.nodes()) {
      int64_t node_lease = 0;
      for (const auto& n : *nodes)
        if (n.name() == na.node()) node_lease = n.lease_id();
      for (const auto& dev : na.devices()) {
        std::string key = keys::Alloc(na.node(), dev);
        ok = ok && store->SetWithLease(key, id, node_lease).ok();
        claimed.push_back(key);
      }
    }
    int next_attempt = job.attempts_size();
    // Fence off every older attempt before this one can start (job/keys.h Fence): a worker of
    // attempt n-1 still running on a host cut off from the store has its writes refused.
    ok = ok && store->Set(keys::Fence(id), absl::StrCat(next_attempt)).ok();
    auto updated = ok ? UpdateRecord(id, [&](Job* j) {
      if (j->state() != jobs::v1::PENDING && j->state() != jobs::v1::RESTARTING) return false;
      scheduler.StartAttempt(j, next_attempt, placed);
      return true;
    }) : absl::StatusOr<Job>(absl::UnavailableError("alloc failed"));
    if (!updated.ok() || updated->state() != jobs::v1::RUNNING) {
      for (const auto& k : claimed) (void)store->Delete(k);
      continue;
    }
    std::vector<std::string> where;
    for (const auto& na : placed.nodes())
      where.push_back(absl::StrCat(na.node(), "[", absl::StrJoin(na.devices(), ","), "]"));
    spdlog::info("placed {} attempt {}: {}", id, next_attempt, absl::StrJoin(where, " "));
  }
  ForgetFinished();
}

void Daemon::Impl::ForgetFinished() {
  if (!scheduler.RetentionDue()) return;
  auto listed = store->ListKeys("joblist/");
  auto active = store->ListKeys("active/");
  if (!listed.ok() || !active.ok()) return;
  std::set<std::string> running;
  for (const std::string& k : *active) running.insert(k.substr(strlen("active/")));
  std::vector<std::string> ids, record_keys;
  for (const std::string& k : *listed) {
    std::string id = k.substr(strlen("joblist/"));
    if (running.count(id) || !CheckJobId(id).ok()) continue;
    record_keys.push_back(keys::Record(id));
    ids.push_back(std::move(id));
  }
  auto records = store->MultiGet(record_keys);
  if (!records.ok()) return;
  std::vector<Job> finished;
  for (size_t i = 0; i < records->size() && i < ids.size(); ++i) {
    // Only a record whose id is its key's (ParseRecord): a forged one naming another job must not
    // make this pass delete that job's keys.
    auto j = (*records)[i] ? ParseRecord(ids[i], *(*records)[i]) : absl::StatusOr<Job>(absl::NotFoundError(""));
    if (j.ok() && IsTerminal(j->state())) finished.push_back(std::move(*j));
  }
  const std::vector<std::string> forget = scheduler.ToForget(finished);
  for (const std::string& id : forget) {
    for (const Job& j : finished) {
      if (j.id() == id && !j.submission_id().empty()) {
        (void)store->Delete(keys::Submission(j.submission_id()));
      }
    }
    (void)store->Delete(keys::JobList(id));  // first: a listing never shows a half-deleted job
    auto n = store->DeletePrefix(absl::StrCat("jobs/", id, "/"));
    spdlog::info("retention: forgot finished job {} ({} store keys)", id, n.ok() ? *n : -1);
  }
}

void Daemon::Impl::CheckAttempt(const Job& job, const std::set<std::string>& alive) {
  const std::string& id = job.id();
  const int n = job.attempts(job.attempts_size() - 1).number();
  AttemptSnapshot s;
  s.job = job;
  s.alive = alive;
  auto failure = store->Get(keys::Failure(id, n));
  std::vector<std::string> exit_keys;
  for (int r = 0; r < job.world_size(); ++r) exit_keys.push_back(keys::Exit(id, n, r));
  auto exits = store->MultiGet(exit_keys);
  if (!exits.ok()) return;
  auto stop = store->Get(keys::Stop(id, n));
  if (RankExit cause; failure.ok() && cause.ParseFromString(*failure)) s.failure = cause;
  if (stop.ok()) s.stop = *stop;
  for (const auto& v : *exits) {
    std::optional<RankExit>& e = s.exits.emplace_back();
    if (v) e.emplace().ParseFromString(*v);
  }

  const AttemptAction act = scheduler.CheckAttempt(s);
  if (act.kind == AttemptAction::kSucceeded) {
    auto r = UpdateRecord(id, [&](Job* j) {
      if (j->state() != jobs::v1::RUNNING || j->attempts_size() != job.attempts_size()) return false;
      scheduler.MarkSucceeded(j);
      return true;
    });
    if (r.ok()) spdlog::info("job {} succeeded", id);
    return;
  }
  if (act.kind == AttemptAction::kDrained) {
    auto r = UpdateRecord(id, [&](Job* j) {
      if (IsTerminal(j->state()) || j->attempts_size() != job.attempts_size()) return false;
      scheduler.MarkDrained(j);
      return true;
    });
    if (r.ok()) spdlog::info("job {} checkpointed and stopped on request", id);
    return;
  }
  if (!act.stop_reason.empty()) {
    (void)store->CompareSet(keys::Stop(id, n), std::nullopt, act.stop_reason);
    spdlog::warn("job {} attempt {}: {}; stopping every rank", id, n, act.stop_reason);
  }
  if (act.kind != AttemptAction::kDecideFailure) return;

  FailureReport report;
  report.reason = act.reason;
  report.cause = act.cause;
  if (opts.analyze_flight) {
    report.verdict = opts.analyze_flight(absl::StrCat(JobDir(id), "/flight/attempt-", n));
  }
  // The failing rank's own last step (other ranks race on to a later step before they stop).
  if (auto v = store->Get(keys::Progress(id, n, act.cause ? act.cause->rank() : 0)); v.ok()) {
    jobs::v1::Progress p;
    if (p.ParseFromString(*v)) report.last_step = p.metrics().step();
  }
  bool recorded = false;
  auto r = UpdateRecord(id, [&](Job* j) {
    recorded = false;
    if (j->state() != jobs::v1::RUNNING || j->attempts_size() != job.attempts_size()) return false;
    scheduler.RecordFailure(j, report);
    recorded = true;
    return true;
  });
  if (r.ok() && recorded && r->state() == jobs::v1::RESTARTING) metrics->CountRestart();
  if (r.ok()) {
    spdlog::warn("job {} attempt {} failed: {} -> {}", id, n, r->reason(),
                 jobs::v1::JobState_Name(r->state()));
  }
}

}  // namespace ember::daemon
