// One rank of the device-backend policy tests (device_policy_test): the nccl / nccl-lazy /
// nccl-legacy policy (runtime/comm/device_backend.h) over CpuCommDriver, i.e. the cpu backend's
// communicators, bootstrapped through the real store. Exit 0 = every check passed.
//
//   device_policy_worker --scenario=creation --backend=nccl-lazy --rank=0 --size=3
//       --store=127.0.0.1:PORT --store_prefix=jobs/t/attempt/0/     (one command line)
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/cpu_comm_driver.h"
#include "runtime/comm/device_backend.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/store_rendezvous.h"
#include "runtime/flight/recorder.h"
#include "runtime/job/keys.h"
#include "runtime/store/client.h"
#include "tests/comm/worker_rendezvous.h"

ABSL_FLAG(std::string, scenario, "creation",
          "creation|legacy|split|abort|async|shrink|inprogress|legacy_stream|race");
ABSL_FLAG(double, in_progress, 0.3, "fake NCCL: probability that a collective returns in progress");
ABSL_FLAG(uint64_t, seed, 1, "fake NCCL: seed of the in-progress draws (plus the rank)");
ABSL_FLAG(std::string, backend, "nccl", "nccl|nccl-lazy|nccl-legacy (shrink: also cpu)");
ABSL_FLAG(int, rank, 0, "");
ABSL_FLAG(int, size, 2, "");
ABSL_FLAG(std::string, store, "", "store address host:port");
ABSL_FLAG(std::string, store_prefix, ember::job::keys::AttemptPrefix("test", 0),
          "job/attempt key prefix");

namespace ember::comm {
namespace {

int g_rank = 0, g_size = 1, g_failures = 0;
std::shared_ptr<Rendezvous> g_rdzv;
std::shared_ptr<CpuCommDriver> g_driver;

#define CHECK_OR_FAIL(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "[rank %d] CHECK failed line %d: %s %s\n", g_rank, __LINE__, #cond, \
                   absl::StrCat(__VA_ARGS__).c_str());                                        \
      ++g_failures;                                                                           \
    }                                                                                         \
  } while (0)

// How many driver log lines start with `prefix`.
int Count(const std::string& prefix) {
  int n = 0;
  for (const std::string& l : g_driver->Log()) n += absl::StartsWith(l, prefix);
  return n;
}
std::string LogText() { return absl::StrJoin(g_driver->Log(), " | "); }

GroupOptions Options(const std::string& name, const std::string& backend) {
  GroupOptions o;
  o.name = name;
  o.backend = backend;
  o.device = "cpu:0";
  o.comm_driver = g_driver;
  o.bootstrap_timeout = absl::Seconds(20);
  o.timeout = absl::Seconds(30);
  return o;
}

// all_reduce(sum) of (rank + 1) * (i + 1) over `pg`; checks against the closed form.
void CheckAllReduce(ProcessGroup& pg, const std::string& what, int64_t want_factor) {
  std::vector<int64_t> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (pg.rank() + 1) * static_cast<int64_t>(i + 1);
  // The op completes later on the communicator's stream: the host waits for it (block_host).
  absl::Status s = pg.AllReduce(v.data(), v.size(), DataType::kI64, ReduceOp::kSum)
                       ->Wait(absl::Seconds(30), /*block_host=*/true);
  CHECK_OR_FAIL(s.ok(), what, ": ", s.ToString());
  bool good = true;
  for (size_t i = 0; i < v.size(); ++i) good = good && v[i] == want_factor * static_cast<int64_t>(i + 1);
  CHECK_OR_FAIL(good, what, ": wrong all_reduce result, v[0]=", v[0], " want ", want_factor);
}

// Ring: send to rank+1, receive from rank-1, `rounds` times; checks the payloads.
void Ring(ProcessGroup& pg, int rounds) {
  const int next = (pg.rank() + 1) % pg.size(), prev = (pg.rank() + pg.size() - 1) % pg.size();
  for (int k = 0; k < rounds; ++k) {
    int32_t out = 100 * pg.rank() + k, in = -1;
    auto ws = pg.Send(&out, 1, DataType::kI32, next, 7);
    auto wr = pg.Recv(&in, 1, DataType::kI32, prev, 7);
    absl::Status s1 = ws->Wait(absl::Seconds(30)), s2 = wr->Wait(absl::Seconds(30));
    CHECK_OR_FAIL(s1.ok() && s2.ok(), "ring ", k, ": ", s1.ToString(), " / ", s2.ToString());
    CHECK_OR_FAIL(in == 100 * prev + k, "ring ", k, " got ", in);
  }
}

int64_t SumFactor(int n) { return static_cast<int64_t>(n) * (n + 1) / 2; }

// Creation counts: eager at group creation; lazy main at the first collective and one P2P
// communicator per peer pair at the first send/recv; legacy at the first collective.
absl::Status Creation(const std::string& backend) {
  const int peers = g_size == 2 ? 1 : 2;  // the ring talks to next and prev
  flight::FlightRecorder recorder;
  GroupOptions o = Options("world", backend);
  o.recorder = &recorder;
  o.watchdog_period = absl::Milliseconds(20);
  ASSIGN_OR_RETURN(auto pg, ProcessGroup::Create(g_rdzv, g_rank, g_size, o));
  const int at_create = Count("init main");
  CHECK_OR_FAIL(at_create == (backend == "nccl" ? 1 : 0), backend, ": main inits at creation ",
                at_create, " log: ", LogText());
  CheckAllReduce(*pg, "first all_reduce", SumFactor(g_size));
  CHECK_OR_FAIL(Count("init main") == 1, "main inits after a collective: ", LogText());
  Ring(*pg, 3);
  const int p2p = Count("init p2p");
  CHECK_OR_FAIL(p2p == (backend == "nccl" ? 0 : peers), backend, ": p2p inits ", p2p, " want ",
                backend == "nccl" ? 0 : peers, " log: ", LogText());
  Ring(*pg, 3);
  CheckAllReduce(*pg, "second all_reduce", SumFactor(g_size));
  CHECK_OR_FAIL(Count("init p2p") == p2p && Count("init main") == 1,
                "communicators are created once: ", LogText());
  // The watchdog copies each collective's device times (here: host times) into the recorder.
  absl::SleepFor(absl::Milliseconds(200));
  int timed = 0;
  for (const flight::Entry& e : recorder.Entries()) {
    if (e.collective_seq > 0 && e.device_start_ns > 0 && e.device_end_ns >= e.device_start_ns) ++timed;
  }
  CHECK_OR_FAIL(timed == 2, "collectives with device times in the recorder: ", timed);
  CHECK_OR_FAIL(internal::LegacyWarningCount() == (backend == "nccl-legacy" ? 1 : 0),
                "legacy warnings ", internal::LegacyWarningCount());
  return pg->Barrier()->Wait(absl::Seconds(30));
}

// nccl-legacy: two devices per process, one warning for two groups; nccl refuses two devices.
absl::Status Legacy() {
  GroupOptions two = Options("two", "nccl");
  two.device = "cpu:0,cpu:1";
  auto refused = ProcessGroup::Create(g_rdzv, g_rank, g_size, two);
  CHECK_OR_FAIL(absl::IsInvalidArgument(refused.status()) &&
                    absl::StrContains(refused.status().message(), "nccl-legacy"),
                "nccl with two devices: ", refused.status().ToString());
  two.backend = "nccl-legacy";
  ASSIGN_OR_RETURN(auto pg, ProcessGroup::Create(g_rdzv, g_rank, g_size, two));
  CHECK_OR_FAIL(Count("init main") == 0, "legacy creates nothing before a collective: ", LogText());
  // One buffer per device: device d of rank r holds (2r + d + 1) * (i + 1).
  std::vector<int64_t> b0(100), b1(100);
  for (size_t i = 0; i < b0.size(); ++i) {
    b0[i] = (2 * g_rank + 1) * static_cast<int64_t>(i + 1);
    b1[i] = (2 * g_rank + 2) * static_cast<int64_t>(i + 1);
  }
  void* bufs[2] = {b0.data(), b1.data()};
  RETURN_IF_ERROR(pg->AllReduce(bufs, b0.size(), DataType::kI64, ReduceOp::kSum)
                      ->Wait(absl::Seconds(30), /*block_host=*/true));
  const int64_t want = SumFactor(2 * g_size);
  CHECK_OR_FAIL(b0[9] == want * 10 && b1[9] == want * 10, "two-device sum ", b0[9], " ", b1[9]);
  CHECK_OR_FAIL(Count("init main") == 2, "one communicator per device: ", LogText());
  ASSIGN_OR_RETURN(auto one, ProcessGroup::Create(g_rdzv, g_rank, g_size, Options("one", "nccl-legacy")));
  CheckAllReduce(*one, "legacy one device", SumFactor(g_size));
  CHECK_OR_FAIL(internal::LegacyWarningCount() == 1, "one warning per process, got ",
                internal::LegacyWarningCount());
  return one->Barrier()->Wait(absl::Seconds(30));
}

// Split: members get a working group, a non-member gets none (no hang); members of a split that a
// rank never joins fail after the bootstrap timeout instead of hanging.
absl::Status Split(const std::string& backend) {
  GroupOptions o = Options("world", backend);
  o.bootstrap_timeout = absl::Seconds(3);
  ASSIGN_OR_RETURN(auto pg, ProcessGroup::Create(g_rdzv, g_rank, g_size, o));
  CheckAllReduce(*pg, "world", SumFactor(g_size));
  std::vector<int> firsts;
  for (int r = 0; r + 1 < g_size; ++r) firsts.push_back(r);
  ASSIGN_OR_RETURN(auto sub, pg->NewGroup(firsts));
  if (g_rank == g_size - 1) {
    CHECK_OR_FAIL(sub == nullptr, "non-member got a group");
  } else {
    CHECK_OR_FAIL(sub != nullptr && sub->size() == g_size - 1, "member's group");
    if (sub) CheckAllReduce(*sub, "subgroup", SumFactor(g_size - 1));
  }
  // Split by parity, keys reversed.
  ASSIGN_OR_RETURN(auto par, pg->Split(g_rank % 2, -g_rank));
  CHECK_OR_FAIL(par != nullptr, "split member");
  if (par) {
    int n = 0;
    for (int r = g_rank % 2; r < g_size; r += 2) ++n;
    CHECK_OR_FAIL(par->size() == n && par->rank() == (n - 1 - g_rank / 2), "split rank ",
                  par->rank(), "/", par->size());
    RETURN_IF_ERROR(par->Barrier()->Wait(absl::Seconds(30)));
  }
  // The last rank does not take part: members must get an error within the timeout.
  if (g_rank != g_size - 1) {
    absl::Time t0 = absl::Now();
    auto lone = pg->Split(0, g_rank);
    double secs = absl::ToDoubleSeconds(absl::Now() - t0);
    CHECK_OR_FAIL(!lone.ok() && absl::StrContains(lone.status().message(), "did not take part"),
                  "split without rank ", g_size - 1, ": ", lone.status().ToString());
    CHECK_OR_FAIL(secs < 10, "split error after ", secs, " s");
  }
  // A failed split leaves the parent alone (nccl driver: only the new handle is aborted; the
  // fake fails the process on a second abort of any handle).
  CheckAllReduce(*pg, "world after a failed split", SumFactor(g_size));
  CHECK_OR_FAIL(Count("abort main") == 0 && Count("revoke main") == 0,
                "the parent was not aborted by the failed split: ", LogText());
  return absl::OkStatus();
}

// A timed-out op on one group aborts every communicator of the process together; other groups
// then fail with ABORTED; the process still reports.
absl::Status AbortAll(const std::string& backend) {
  GroupOptions o = Options("world", backend);
  o.watchdog_period = absl::Milliseconds(20);
  ASSIGN_OR_RETURN(auto a, ProcessGroup::Create(g_rdzv, g_rank, g_size, o));
  ASSIGN_OR_RETURN(auto b, ProcessGroup::Create(g_rdzv, g_rank, g_size, Options("other", backend)));
  CheckAllReduce(*a, "a", SumFactor(g_size));
  CheckAllReduce(*b, "b", SumFactor(g_size));
  Ring(*a, 1);
  const int comms = Count("init ");
  if (g_rank == 0) {
    std::vector<int64_t> v(10, 1);
    auto w = a->AllReduce(v.data(), v.size(), DataType::kI64, ReduceOp::kSum, {.timeout = absl::Seconds(1)});
    // Enqueued at once; the host learns that it never finished when the watchdog's abort
    // completes its end event.
    absl::Status s = w->Wait(absl::Seconds(20), /*block_host=*/true);
    CHECK_OR_FAIL(absl::IsDeadlineExceeded(s), "hung op: ", s.ToString());
    // The other group learns of the abort from its watchdog (the backend's AsyncError).
    absl::SleepFor(absl::Milliseconds(500));
    s = b->AllReduce(v.data(), v.size(), DataType::kI64, ReduceOp::kSum)->Wait(absl::Seconds(20));
    CHECK_OR_FAIL(absl::IsAborted(s), "other group after the abort: ", s.ToString());
    std::vector<std::string> log = g_driver->Log();
    // Revoked (ncclCommRevoke), not freed: threads inside a call keep a valid handle.
    auto first = std::find_if(log.begin(), log.end(), [](const std::string& l) { return absl::StartsWith(l, "revoke"); });
    const int aborts = static_cast<int>(std::count_if(first, log.end(), [](const std::string& l) {
      return absl::StartsWith(l, "revoke");
    }));
    CHECK_OR_FAIL(aborts == comms && aborts == static_cast<int>(log.end() - first),
                  "every communicator revoked together (", comms, "): ", LogText());
    CHECK_OR_FAIL(Count("abort ") == 0, "no handle freed while the groups live: ", LogText());
    RETURN_IF_ERROR(g_rdzv->Set("reported", "1"));
  } else {
    RETURN_IF_ERROR(g_rdzv->Get("reported", absl::Seconds(30)).status());
  }
  return absl::OkStatus();
}

// An asynchronous communicator error reaches every group as ABORTED naming it.
absl::Status Async(const std::string& backend) {
  GroupOptions o = Options("world", backend);
  o.watchdog_period = absl::Milliseconds(20);
  ASSIGN_OR_RETURN(auto a, ProcessGroup::Create(g_rdzv, g_rank, g_size, o));
  CheckAllReduce(*a, "a", SumFactor(g_size));
  RETURN_IF_ERROR(a->Barrier()->Wait(absl::Seconds(30)));
  g_driver->InjectAsyncError(absl::InternalError("injected NVLink error"));
  absl::SleepFor(absl::Milliseconds(300));
  std::vector<int64_t> v(10, 1);
  absl::Status s = a->AllReduce(v.data(), v.size(), DataType::kI64, ReduceOp::kSum)->Wait(absl::Seconds(20));
  CHECK_OR_FAIL(absl::IsAborted(s) && absl::StrContains(s.message(), "injected NVLink error"),
                "after an async error: ", s.ToString());
  return absl::OkStatus();
}

// The last rank leaves; the survivors' op fails, the watchdog aborts the group (every
// communicator of the process), and the survivors shrink it and all_reduce correctly: shrink
// after an abort (nccl: the parent handle must still be valid, i.e. revoked, not freed).
absl::Status Shrink(const std::string& backend) {
  GroupOptions o = Options("world", backend);
  o.watchdog_period = absl::Milliseconds(20);
  ASSIGN_OR_RETURN(auto pg, ProcessGroup::Create(g_rdzv, g_rank, g_size, o));
  CheckAllReduce(*pg, "before", SumFactor(g_size));
  RETURN_IF_ERROR(pg->Barrier()->Wait(absl::Seconds(30)));
  if (g_rank == g_size - 1) _exit(0);  // dies without a word
  std::vector<int64_t> v(10, 1);
  absl::Status s = pg->AllReduce(v.data(), v.size(), DataType::kI64, ReduceOp::kSum)
                       ->Wait(absl::Seconds(30), /*block_host=*/true);
  CHECK_OR_FAIL(!s.ok(), "all_reduce with a dead rank succeeded");
  if (backend != "cpu") {
    // The op's error is the communicator's async error: the watchdog aborts the group.
    absl::Status again;
    for (int i = 0; i < 100 && again.ok(); ++i) {
      absl::SleepFor(absl::Milliseconds(20));
      again = pg->AllReduce(v.data(), v.size(), DataType::kI64, ReduceOp::kSum)
                  ->Wait(absl::Seconds(30), /*block_host=*/true);
      if (!again.ok() && !absl::IsAborted(again)) again = absl::OkStatus();
    }
    CHECK_OR_FAIL(absl::IsAborted(again), "group not aborted after the failed op: ", again.ToString());
    CHECK_OR_FAIL(Count("revoke main") == 1, "the parent was revoked: ", LogText());
  }
  auto self = pg->Shrink({g_rank});
  CHECK_OR_FAIL(absl::IsInvalidArgument(self.status()), "excluding oneself: ", self.status().ToString());
  ASSIGN_OR_RETURN(auto small, pg->Shrink({g_size - 1}));
  CHECK_OR_FAIL(small->size() == g_size - 1 && small->rank() == g_rank, "shrunk rank ",
                small->rank(), "/", small->size());
  CheckAllReduce(*small, "after shrink", SumFactor(g_size - 1));
  // ...twice, to show the group keeps working.
  CheckAllReduce(*small, "after shrink, again", SumFactor(g_size - 1));
  return absl::OkStatus();
}

// NCCL's non-blocking contract: collectives return in progress at random (most of them here) and
// complete later on the communicator's stream. Every result must be right: after
// Wait(block_host), and after Wait (the compute stream waits on the op) plus a sync of the
// compute stream; all_gather and reduce_scatter too.
absl::Status InProgress(const std::string& backend) {
  ASSIGN_OR_RETURN(auto pg, ProcessGroup::Create(g_rdzv, g_rank, g_size, Options("world", backend)));
  FakeStream* compute = g_driver->StreamOf(CurrentStream());
  const int n = g_size;
  for (int it = 0; it < 40; ++it) {
    std::vector<int64_t> v(4096);
    for (size_t i = 0; i < v.size(); ++i) v[i] = (g_rank + 1) * static_cast<int64_t>(i + it);
    auto w = pg->AllReduce(v.data(), v.size(), DataType::kI64, ReduceOp::kSum);
    absl::Status s;
    if (it % 2 == 0) {
      s = w->Wait(absl::Seconds(30), /*block_host=*/true);
    } else {
      s = w->Wait(absl::Seconds(30));  // the compute stream waits on the op's end event
      if (s.ok() && !compute->Synchronize(absl::Seconds(30))) s = absl::DeadlineExceededError("sync");
    }
    CHECK_OR_FAIL(s.ok(), "all_reduce ", it, ": ", s.ToString());
    bool good = true;
    for (size_t i = 0; i < v.size(); ++i) good = good && v[i] == SumFactor(n) * static_cast<int64_t>(i + it);
    CHECK_OR_FAIL(good, "all_reduce ", it, ": v[1]=", v[1], " want ", SumFactor(n) * (1 + it));
    if (!good) break;
    std::vector<float> mine(64, static_cast<float>(g_rank + it)), all(64 * n, -1);
    s = pg->AllGatherSingle(mine.data(), all.data(), mine.size(), DataType::kF32)
            ->Wait(absl::Seconds(30), /*block_host=*/true);
    CHECK_OR_FAIL(s.ok(), "all_gather ", it, ": ", s.ToString());
    for (int r = 0; r < n; ++r)
      CHECK_OR_FAIL(all[64 * r + 5] == static_cast<float>(r + it), "all_gather ", it, " rank ", r,
                    ": ", all[64 * r + 5]);
  }
  CHECK_OR_FAIL(g_driver->InProgressCount() > 20, "in-progress calls: ", g_driver->InProgressCount());
  return pg->Barrier()->Wait(absl::Seconds(30), /*block_host=*/true);
}

// A collective or send from a thread without a current stream (the legacy stream) is refused with
// FAILED_PRECONDITION naming SetCurrentStream, not enqueued unordered against compute.
absl::Status LegacyStream(const std::string& backend) {
  ASSIGN_OR_RETURN(auto pg, ProcessGroup::Create(g_rdzv, g_rank, g_size, Options("world", backend)));
  CheckAllReduce(*pg, "with a stream", SumFactor(g_size));
  void* saved = CurrentStream();
  SetCurrentStream(nullptr);
  std::vector<int64_t> v(10, 1);
  absl::Status s = pg->AllReduce(v.data(), v.size(), DataType::kI64, ReduceOp::kSum)
                       ->Wait(absl::Seconds(30), /*block_host=*/true);
  CHECK_OR_FAIL(absl::IsFailedPrecondition(s) && absl::StrContains(s.message(), "SetCurrentStream"),
                "collective on the legacy stream: ", s.ToString());
  // (The refused collective aborted its group; the send goes to another.)
  SetCurrentStream(saved);
  ASSIGN_OR_RETURN(auto other, ProcessGroup::Create(g_rdzv, g_rank, g_size, Options("other", backend)));
  SetCurrentStream(nullptr);
  int32_t x = 0;
  s = other->Send(&x, 1, DataType::kI32, (g_rank + 1) % g_size, 3)->Wait(absl::Seconds(30));
  CHECK_OR_FAIL(absl::IsFailedPrecondition(s), "send on the legacy stream: ", s.ToString());
  SetCurrentStream(saved);
  return absl::OkStatus();
}

// The watchdog's abort (here another thread's) while the training thread is inside calls on the
// same communicators: the handles must stay valid (revoked, not freed) until the last user is
// gone. The fake fails the process if a handle is freed while a call uses it.
absl::Status Race(const std::string& backend) {
  GroupOptions o = Options("world", backend);
  o.watchdog_period = absl::Milliseconds(5);
  ASSIGN_OR_RETURN(auto a, ProcessGroup::Create(g_rdzv, g_rank, g_size, o));
  ASSIGN_OR_RETURN(auto b, ProcessGroup::Create(g_rdzv, g_rank, g_size, Options("other", backend)));
  CheckAllReduce(*a, "a", SumFactor(g_size));
  CheckAllReduce(*b, "b", SumFactor(g_size));
  RETURN_IF_ERROR(g_rdzv->Set(absl::StrCat("race/ready/", g_rank), "1"));
  for (int r = 0; r < g_size; ++r)
    RETURN_IF_ERROR(g_rdzv->Get(absl::StrCat("race/ready/", r), absl::Seconds(30)).status());
  void* stream = CurrentStream();
  int ok_ops = 0, failed_ops = 0;
  std::thread train([&] {
    SetCurrentStream(stream);
    std::vector<int64_t> v(256, 1);
    for (int i = 0; i < 400; ++i) {
      absl::Status s = b->AllReduce(v.data(), v.size(), DataType::kI64, ReduceOp::kSum,
                                    {.timeout = absl::Seconds(5)})
                           ->Wait(absl::Seconds(20), /*block_host=*/true);
      (s.ok() ? ok_ops : failed_ops)++;
      if (!s.ok() && failed_ops > 20) break;
    }
  });
  absl::SleepFor(absl::Milliseconds(40 + 10 * g_rank));
  a->Abort("test: the watchdog aborts while the training thread enqueues");
  train.join();
  CHECK_OR_FAIL(failed_ops > 0, "ops after the abort failed: ok ", ok_ops, " failed ", failed_ops);
  CHECK_OR_FAIL(g_driver->Violations().empty(), "violations: ",
                absl::StrJoin(g_driver->Violations(), "; "));
  return absl::OkStatus();
}

}  // namespace
}  // namespace ember::comm

int main(int argc, char** argv) {
  using namespace ember::comm;
  absl::ParseCommandLine(argc, argv);
  g_rank = absl::GetFlag(FLAGS_rank);
  g_size = absl::GetFlag(FLAGS_size);
  const std::string scenario = absl::GetFlag(FLAGS_scenario), backend = absl::GetFlag(FLAGS_backend);
  auto rdzv = testing::WorkerRendezvous(absl::GetFlag(FLAGS_store), absl::GetFlag(FLAGS_store_prefix), "");
  if (!rdzv.ok()) {
    std::fprintf(stderr, "[rank %d] store connect: %s\n", g_rank, rdzv.status().ToString().c_str());
    return 2;
  }
  g_rdzv = *rdzv;
  FakeNcclOptions fake;  // strict: a misuse of the fake NCCL aborts this process
  fake.in_progress = absl::GetFlag(FLAGS_in_progress);
  fake.seed = absl::GetFlag(FLAGS_seed) + static_cast<uint64_t>(g_rank);
  g_driver = std::make_shared<CpuCommDriver>(g_rdzv, BackendOptions{}, fake);
  // Device ops order against the submitting thread's stream (the compute stream).
  SetCurrentStream(g_driver->NewStream("compute"));
  absl::Status s;
  if (scenario == "creation") s = Creation(backend);
  else if (scenario == "legacy") s = Legacy();
  else if (scenario == "split") s = Split(backend);
  else if (scenario == "abort") s = AbortAll(backend);
  else if (scenario == "async") s = Async(backend);
  else if (scenario == "shrink") s = Shrink(backend);
  else if (scenario == "inprogress") s = InProgress(backend);
  else if (scenario == "legacy_stream") s = LegacyStream(backend);
  else if (scenario == "race") s = Race(backend);
  else s = absl::InvalidArgumentError("unknown scenario " + scenario);
  if (!s.ok()) {
    std::fprintf(stderr, "[rank %d] %s/%s: %s\n", g_rank, scenario.c_str(), backend.c_str(),
                 s.ToString().c_str());
    return 1;
  }
  if (g_failures) return 1;
  std::fprintf(stderr, "[rank %d] %s/%s ok\n", g_rank, scenario.c_str(), backend.c_str());
  _exit(0);  // skip destructors of groups whose peers may already be gone
}
