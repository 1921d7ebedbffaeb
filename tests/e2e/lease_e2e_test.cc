// The node lease keeper through the real daemon (runtime/daemon/lease.cc), without root or a
// network namespace (tests/multihost/store_flap_test.sh cuts a real link): the node's lease is
// revoked in the store, as its expiry after a long outage would remove it. The daemon must find
// it gone, stop its running attempt with "node lost: <node>" (one restart, not a silent ride
// through), and register again under a new lease.
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "proto/jobs.pb.h"
#include "runtime/store/client.h"
#include "testing/cluster.h"

namespace ember::e2e {
namespace {

namespace v1 = jobs::v1;

template <typename F>
bool WaitFor(F cond, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return cond();
}

TEST_CASE("a node whose lease is gone stops its attempt ('node lost') and registers again") {
  auto cluster = TestCluster::Start({.nodes = 1});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  store::ClientOptions so;
  so.address = (*cluster)->node(0)->store_address();
  so.auth_token = (*cluster)->token();
  so.default_timeout = so.connect_timeout = absl::Seconds(5);
  auto store = store::Client::Connect(so);
  REQUIRE(store.ok());
  auto lease_of_node = [&]() -> int64_t {
    auto v = store->Get("nodes/node-a")  /* keys::Node */;
    v1::Node n;
    return v.ok() && n.ParseFromString(*v) ? n.lease_id() : 0;
  };

  auto r = c->Submit(Spec("lease-lost", 1, 2000) + "max_restarts: 1\n");  // 40 s of steps
  REQUIRE(r.ok());
  const std::string id = r->job().id();
  REQUIRE(WaitFor([&] {
    auto j = c->Get(id);
    return j.ok() && j->state() == v1::RUNNING && j->progress().step() > 0;
  }, absl::Seconds(20)));
  const int64_t old_lease = lease_of_node();
  REQUIRE(old_lease != 0);
  REQUIRE(store->RevokeLease(old_lease).ok());

  // Re-registered under a new lease, the attempt stopped for the lost node, the job restarted.
  REQUIRE(WaitFor([&] { const int64_t l = lease_of_node(); return l != 0 && l != old_lease; },
                  absl::Seconds(10)));
  v1::Job last;
  const bool restarted = WaitFor([&] {
    auto j = c->Get(id);
    if (!j.ok()) return false;
    last = *j;
    return j->attempts_size() == 2 && j->state() == v1::RUNNING;
  }, absl::Seconds(20));
  INFO("state " << v1::JobState_Name(last.state()) << ", attempts " << last.attempts_size()
                << ", reason '" << last.reason() << "'");
  REQUIRE(restarted);
  CHECK(absl::StrContains(last.attempts(0).reason(), "node lost: node-a"));
  REQUIRE(c->Cancel(id).ok());
}

}  // namespace
}  // namespace ember::e2e
