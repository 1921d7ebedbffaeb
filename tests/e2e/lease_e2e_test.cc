// The node lease keeper through the real daemon (runtime/daemon/lease.cc), without root or a
// network namespace (tests/multihost/store_flap_test.sh cuts a real link):
//   * the node's lease revoked in the store, as its expiry after a long outage would remove it:
//     the daemon finds it gone, stops its running attempt with "node lost: <node>" (one restart,
//     not a silent ride through) and registers again under a new lease;
//   * a store that refuses the daemon's token (restarted with another one): the daemon stops its
//     ranks at once, naming the refusal and the token, retries at a bounded rate, and registers
//     again once the store takes the token;
//   * a store unreachable for longer than the lease: the daemon stops its ranks as soon as the
//     lease must have expired (lease_ttl since the last acknowledged refresh), not when the store
//     answers again, and not during a shorter outage;
//   * a daemon restarted after its lease expired (the scheduler declared its node lost) re-attaches
//     to a worker that ignores SIGTERM: the restarted attempt is not placed on that worker's
//     devices before it is killed and reaped.
// The workers are //tests/e2e:test_worker: "patient" ones outlast an unreachable store by 60 s
// (so only the daemon can stop them in time), "deaf" ones ignore SIGTERM and the stop key.
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "proto/jobs.pb.h"
#include "runtime/base/auth.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/process.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "testing/cluster.h"
#include "testing/harness.h"

namespace ember::e2e {
namespace {

namespace v1 = jobs::v1;
namespace keys = daemon::keys;
using recovery::WaitFor;

// The daemons' log lines (spdlog's default logger), added before any daemon thread logs.
std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> Logs() {
  static auto sink = [] {
    auto s = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(20000);
    spdlog::default_logger()->sinks().push_back(s);
    return s;
  }();
  return sink;
}
// Lines holding every one of `needles`.
int CountLogs(std::initializer_list<absl::string_view> needles) {
  int n = 0;
  for (const std::string& line : Logs()->last_formatted()) {
    bool all = true;
    for (absl::string_view s : needles) all = all && absl::StrContains(line, s);
    n += all;
  }
  return n;
}

store::Client Connect(const std::string& address, const std::string& token) {
  store::ClientOptions so;
  so.address = address;
  so.auth_token = token;
  so.default_timeout = so.connect_timeout = absl::Seconds(5);
  auto c = store::Client::Connect(so);
  REQUIRE(c.ok());
  return *c;
}

int64_t LeaseOf(store::Client& store, const std::string& node) {
  auto v = store.Get(keys::Node(node));
  v1::Node n;
  return v.ok() && n.ParseFromString(*v) ? n.lease_id() : 0;
}

// A store owned by the test, durable, that can be stopped and started again on the same port with
// another token (its state, leases included, recovered from the data directory).
class TestStore {
 public:
  TestStore() {
    const char* tmp = getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(tmp ? tmp : "/tmp", "/lease-store-", getpid(), "-", rand() % 100000);
    token_ = base::GenerateToken();
    REQUIRE(Start(token_, "127.0.0.1:0").ok());
    address_ = server_->address();
  }
  ~TestStore() { Stop(); }
  void Stop() {
    if (server_) server_->Shutdown();
    server_.reset();
  }
  // Starts it again (after Stop) on the same address with `token`.
  void Restart(const std::string& token) {
    absl::Status s;
    for (int i = 0; i < 50; ++i) {  // the old listener may take a moment to go
      s = Start(token, address_);
      if (s.ok()) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    FAIL("restarting the store on " << address_ << ": " << s);
  }
  const std::string& address() const { return address_; }
  const std::string& token() const { return token_; }

 private:
  absl::Status Start(const std::string& token, const std::string& address) {
    store::StoreServerOptions so;
    so.address = address;
    so.auth_token = token;
    so.backend.data_dir = dir_;
    auto s = store::StoreServer::Start(so);
    if (!s.ok()) return s.status();
    server_ = std::move(*s);
    return absl::OkStatus();
  }
  std::string dir_, token_, address_;
  std::unique_ptr<store::StoreServer> server_;
};

// Submits `spec` and waits until it runs and reports a step.
std::string SubmitRunning(Client& c, const std::string& spec) {
  auto r = c.Submit(spec);
  REQUIRE(r.ok());
  const std::string id = r->job().id();
  REQUIRE(WaitFor([&] {
    auto j = c.Get(id);
    return j.ok() && j->state() == v1::RUNNING && j->progress().metrics().step() > 0;
  }, absl::Seconds(20)));
  return id;
}

// Waits until `id` runs attempt `n` and its rank 0 reported a step (so no rank is still between
// fork and exec when the test cancels it); returns its record.
v1::Job WaitAttempt(Client& c, const std::string& id, int n, absl::Duration timeout) {
  v1::Job last;
  const bool ok = WaitFor([&] {
    auto j = c.Get(id);
    if (!j.ok()) return false;
    last = *j;
    return j->attempts_size() == n + 1 && j->state() == v1::RUNNING && j->progress().metrics().step() > 0;
  }, timeout);
  INFO("state " << v1::JobState_Name(last.state()) << ", attempts " << last.attempts_size()
                << ", reason '" << last.reason() << "'");
  REQUIRE(ok);
  return last;
}

TEST_CASE("a node whose lease is gone stops its attempt ('node lost') and registers again") {
  Logs();
  auto cluster = TestCluster::Start({.nodes = 1});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  store::Client store = Connect((*cluster)->node(0)->store_address(), (*cluster)->token());

  const std::string id = SubmitRunning(*c, Spec("lease-lost", 1, 2000) + "max_restarts: 1\n");
  const int64_t old_lease = LeaseOf(store, "node-a");
  REQUIRE(old_lease != 0);
  REQUIRE(store.RevokeLease(old_lease).ok());

  // Re-registered under a new lease, the attempt stopped for the lost node, the job restarted.
  REQUIRE(WaitFor([&] {
    const int64_t l = LeaseOf(store, "node-a");
    return l != 0 && l != old_lease;
  }, absl::Seconds(10)));
  const v1::Job last = WaitAttempt(*c, id, 1, absl::Seconds(20));
  CHECK(absl::StrContains(last.attempts(0).reason(), "node lost: node-a"));
  REQUIRE(c->Cancel(id).ok());
}

TEST_CASE("a store refusing the daemon's token: ranks stopped at once, registered again later") {
  Logs();
  TestStore st;
  // Lease 6 s: the refusal below ends well within it, so the store still holds the node's lease
  // and only the daemon's own stop key can say why the attempt ended.
  auto cluster = TestCluster::Start({.nodes = 1, .store_address = st.address(),
                                     .token = st.token(), .lease_ttl = absl::Seconds(6)});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  const std::string id =
      SubmitRunning(*c, Spec("lease-refused-patient-hang", 2, 10) + "max_restarts: 1\n");
  REQUIRE(WaitFor([&] { return daemon::FindJobProcesses(id).size() == 2; }, absl::Seconds(10)));

  // The store comes back with another token: every call of the daemon is UNAUTHENTICATED. Its
  // ranks (patient: they would run on for 60 s) are stopped within a few refresh periods.
  const int registered_before = CountLogs({"node-a registered again under lease"});
  st.Stop();
  st.Restart(base::GenerateToken());
  CHECK(WaitFor([&] { return daemon::FindJobProcesses(id).empty(); }, absl::Seconds(5)));
  // The ranks may leave first (their own store calls are refused too), so wait for the line.
  const auto stopped = [] {
    return CountLogs({"stopping local ranks (node lost: node-a: store refused the lease refresh: "
                      "UNAUTHENTICATED", "; check the daemon's store token)"});
  };
  CHECK(WaitFor([&] { return stopped() >= 1; }, absl::Seconds(5)));
  CHECK(stopped() == 1);
  // Still refused: it tries to register again, paced (0.5 s, then 1 s, ...; not every 250 ms
  // refresh period), and says what to check.
  const auto not_registered = [](absl::string_view try_n) {
    return CountLogs({"node-a is not registered (node lost: node-a: store refused", try_n,
                      "check the daemon's store token (auth_token_file)"});
  };
  REQUIRE(WaitFor([&] { return not_registered("; try 1,") == 1; }, absl::Seconds(5)));
  absl::SleepFor(absl::Milliseconds(1000));  // try 2 comes 0.5 s, try 3 1.5 s after try 1
  CHECK(not_registered("; try 2,") == 1);
  CHECK(not_registered("; try 3,") == 0);

  // The store takes the daemon's token again: the stop key says why, the attempt restarts, the
  // node is registered again.
  st.Stop();
  st.Restart(st.token());
  const v1::Job last = WaitAttempt(*c, id, 1, absl::Seconds(20));
  CHECK(absl::StartsWith(last.attempts(0).reason(),
                         "node lost: node-a: store refused the lease refresh: UNAUTHENTICATED"));
  CHECK(CountLogs({"node-a registered again under lease"}) == registered_before + 1);
  REQUIRE(c->Cancel(id).ok());
}

TEST_CASE("a store unreachable for longer than the lease: ranks stopped once the lease must "
          "have expired") {
  Logs();
  TestStore st;
  auto cluster = TestCluster::Start(
      {.nodes = 1, .store_address = st.address(), .token = st.token()});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  const std::string id =
      SubmitRunning(*c, Spec("lease-cutoff-patient-hang", 2, 10) + "max_restarts: 1\n");
  REQUIRE(WaitFor([&] { return daemon::FindJobProcesses(id).size() == 2; }, absl::Seconds(10)));

  // Lease 3 s (TestCluster), refreshed every 250 ms: the ranks ride through the first 2 s, and
  // are stopped soon after 3 s + one try, while the store is still away.
  st.Stop();
  const absl::Time down = absl::Now();
  absl::SleepFor(absl::Seconds(2));
  CHECK(daemon::FindJobProcesses(id).size() == 2);
  CHECK(WaitFor([&] { return daemon::FindJobProcesses(id).empty(); }, absl::Seconds(4)));
  const absl::Duration stopped_after = absl::Now() - down;
  INFO("ranks gone " << stopped_after << " after the store went away");
  CHECK(stopped_after < absl::Seconds(6));
  CHECK(CountLogs({"stopping local ranks (node lost: node-a: no lease refresh acknowledged for",
                   "(lease_ttl 3s): the store has expired the lease)"}) == 1);
  CHECK(CountLogs({"expired in the store (node lost: node-a: no lease refresh"}) == 1);

  // The store back (its leases recovered afresh): the stop key says why, one restart.
  absl::SleepFor(absl::Seconds(6) - (absl::Now() - down));
  st.Restart(st.token());
  const v1::Job last = WaitAttempt(*c, id, 1, absl::Seconds(20));
  CHECK(absl::StartsWith(last.attempts(0).reason(),
                         "node lost: node-a: no lease refresh acknowledged for"));
  REQUIRE(c->Cancel(id).ok());
}

TEST_CASE("a node declared lost by the scheduler gets no attempt on devices its old workers "
          "still hold") {
  Logs();
  auto cluster = TestCluster::Start({.nodes = 2});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  store::Client store = Connect((*cluster)->node(0)->store_address(), (*cluster)->token());
  // 4 ranks on 2 + 2 devices: the restarted attempt can only run on the same devices. Deaf ranks
  // hold them until SIGKILL, kill_grace (1 s) after their SIGTERM.
  const std::string id =
      SubmitRunning(*c, Spec("lease-reattach-deaf-hang", 4, 10) + "max_restarts: 2\n");
  v1::Job j0 = *c->Get(id);
  REQUIRE(j0.attempts(0).assignment().nodes_size() == 2);
  std::vector<int> b_ranks;
  for (const auto& na : j0.attempts(0).assignment().nodes()) {
    if (na.node() != "node-b") continue;
    for (int i = 0; i < na.devices_size(); ++i) b_ranks.push_back(na.first_rank() + i);
  }
  REQUIRE(b_ranks.size() == 2);

  // node-b's daemon goes away (its workers run on) and its lease expires: the scheduler declares
  // node-b lost and waits to restart the job until node-b is back.
  (*cluster)->Detach(1);
  const int64_t b_lease = LeaseOf(store, "node-b");
  REQUIRE(b_lease != 0);
  REQUIRE(store.RevokeLease(b_lease).ok());
  REQUIRE(WaitFor([&] {
    auto j = c->Get(id);
    return j.ok() && j->state() == v1::RESTARTING;
  }, absl::Seconds(15)));
  CHECK(absl::StrContains(c->Get(id)->attempts(0).reason(), "node lost: node-b"));
  absl::SleepFor(absl::Milliseconds(400));  // past the restart backoff (200 ms)

  // node-b's daemon restarts under a new lease and re-attaches to its attempt-0 workers; they
  // ignore the stop key and SIGTERM, and hold cpu:0 and cpu:1 until SIGKILL.
  REQUIRE((*cluster)->StartAgain(1).ok());
  const v1::Job j1 = WaitAttempt(*c, id, 1, absl::Seconds(20));
  int64_t last_exit_ms = 0;
  REQUIRE(WaitFor([&] {
    auto v = store.MultiGet({keys::Exit(id, 0, b_ranks[0]), keys::Exit(id, 0, b_ranks[1])});
    if (!v.ok() || !(*v)[0] || !(*v)[1]) return false;
    for (const auto& e : *v) {
      v1::RankExit x;
      REQUIRE(x.ParseFromString(*e));
      last_exit_ms = std::max(last_exit_ms, x.unix_ms());
    }
    return true;
  }, absl::Seconds(10)));
  INFO("attempt 1 started " << j1.attempts(1).start_unix_ms() - last_exit_ms
                            << " ms after node-b's attempt-0 workers were reaped");
  CHECK(j1.attempts(1).start_unix_ms() >= last_exit_ms);
  REQUIRE(c->Cancel(id).ok());
}

}  // namespace
}  // namespace ember::e2e
