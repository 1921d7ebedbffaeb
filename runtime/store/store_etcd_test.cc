// The etcd backend against real etcd processes (etcd_test_util.h): what the shared suite
// (store_test.cc on etcd) cannot show: leases on etcd's clock, several stores on one etcd, a watch
// across an etcd restart, failure within the deadline, etcd auth, the ember-store binary's flags,
// and kill -9 of the raft leader under load.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runtime/store/client.h"
#include "runtime/store/etcd_backend.h"
#include "runtime/store/etcd_test_util.h"
#include "runtime/store/server.h"
#include "runtime/store/store_process_test_util.h"

namespace ember::store {
namespace {

using testing::EtcdTestCluster;

// An in-process store server on `endpoints`, and a client of it.
struct EtcdStore {
  EtcdStore(std::vector<std::string> endpoints, std::string prefix = "/t/",
            absl::Duration op_timeout = absl::Seconds(15), std::string user = "",
            std::string password = "") {
    EtcdOptions e;
    e.endpoints = std::move(endpoints);
    e.prefix = std::move(prefix);
    e.op_timeout = op_timeout;
    e.user = std::move(user);
    e.password = std::move(password);
    StoreServerOptions opts;
    opts.make_backend = [e](const BackendOptions& b, base::Clock*) {
      return NewEtcdBackend(e, b);
    };
    auto s = StoreServer::Start(std::move(opts));
    REQUIRE(s.ok());
    server = std::move(*s);
    ClientOptions co;
    co.address = server->address();
    auto c = Client::Connect(co);
    REQUIRE(c.ok());
    client = std::make_unique<Client>(*c);
  }
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<Client> client;
};

TEST_CASE("leases expire on etcd's clock unless kept alive; revoke deletes their keys") {
  EtcdTestCluster etcd(1);
  EtcdStore s(etcd.endpoints());
  Client& c = *s.client;
  auto kept = c.GrantLease(absl::Seconds(2));
  auto dropped = c.GrantLease(absl::Seconds(2));
  REQUIRE(kept.ok());
  REQUIRE(dropped.ok());
  REQUIRE(c.SetWithLease("nodes/a", "alive", *kept).ok());
  REQUIRE(c.SetWithLease("nodes/a2", "alive", *kept).ok());
  REQUIRE(c.SetWithLease("nodes/b", "alive", *dropped).ok());
  // etcd expires a 2 s lease within about a second after its TTL.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until) {
    REQUIRE(c.RefreshLease(*kept).ok());
    absl::SleepFor(absl::Milliseconds(400));
  }
  REQUIRE(absl::IsNotFound(c.Get("nodes/b").status()));
  REQUIRE(*c.Get("nodes/a") == "alive");
  REQUIRE(absl::IsNotFound(c.RefreshLease(*dropped)));
  REQUIRE(absl::IsNotFound(c.SetWithLease("nodes/c", "x", *dropped)));
  REQUIRE(c.RevokeLease(*kept).ok());
  REQUIRE(absl::IsNotFound(c.Get("nodes/a").status()));
  REQUIRE(absl::IsNotFound(c.Get("nodes/a2").status()));
  REQUIRE(absl::IsNotFound(c.RevokeLease(*kept)));
}

TEST_CASE("two stores on one etcd prefix: exact Add totals, shared keys, cross-store wake-ups") {
  EtcdTestCluster etcd(1);
  EtcdStore a(etcd.endpoints()), b(etcd.endpoints());
  // A blocking Get on b wakes from a Set through a (via etcd's watch, not a shared process).
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    REQUIRE(a.client->Set("ready", "1").ok());
  });
  auto v = b.client->Get("ready", {.wait = true, .timeout = absl::Seconds(10)});
  setter.join();
  REQUIRE(v.ok());
  REQUIRE(*v == "1");
  constexpr int kThreads = 4, kAdds = 150;
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 2 * kThreads; ++t) {
    ts.emplace_back([&, t] {
      Client& c = t % 2 == 0 ? *a.client : *b.client;
      for (int i = 0; i < kAdds; ++i) errors += !c.Add("counter", 1).ok();
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(errors == 0);
  REQUIRE(*a.client->Get("counter") == absl::StrCat(2 * kThreads * kAdds));
  REQUIRE(*b.client->NumKeys("") == 2);
}

TEST_CASE("an add that starts from the key's last known revision sees other stores' changes") {
  EtcdTestCluster etcd(1);
  EtcdStore a(etcd.endpoints()), b(etcd.endpoints());
  REQUIRE(*a.client->Add("n", 1) == 1);
  REQUIRE(*a.client->Add("n", 1) == 2);  // a knows n's value and revision now
  REQUIRE(b.client->Set("n", "10").ok());
  REQUIRE(*a.client->Add("n", 1) == 11);  // the stale guess loses its compare: no lost update
  REQUIRE(b.client->Set("n", "abc").ok());
  auto bad = a.client->Add("n", 1);
  REQUIRE(absl::IsInvalidArgument(bad.status()));  // answered from etcd's value, not the guess
  REQUIRE(*b.client->Get("n") == "abc");
  REQUIRE(b.client->Delete("n").ok());
  REQUIRE(*a.client->Add("n", 5) == 5);  // deleted meanwhile: starts from 0
  REQUIRE(*b.client->Get("n") == "5");
}

TEST_CASE("the waker watch stops when nobody waits and starts again for the next waiter") {
  EtcdTestCluster etcd(1);
  EtcdStore a(etcd.endpoints()), b(etcd.endpoints());
  for (int round = 0; round < 2; ++round) {
    const std::string key = absl::StrCat("ready", round);
    std::thread setter([&] {
      absl::SleepFor(absl::Milliseconds(300));
      REQUIRE(a.client->Set(key, "1").ok());
    });
    auto v = b.client->Get(key, {.wait = true, .timeout = absl::Seconds(10)});
    setter.join();
    REQUIRE(v.ok());
    REQUIRE(*v == "1");
    REQUIRE(b.client->Wait({key}, absl::Seconds(1)).ok());  // present: no wait
    absl::SleepFor(absl::Seconds(3));  // > the waker's 2 s idle time: it stops
  }
}

TEST_CASE("concurrent Adds on one key from many connections combine: each result once, 1..N") {
  EtcdTestCluster etcd(1);
  EtcdStore s(etcd.endpoints());
  constexpr int kConns = 16, kAdds = 20;
  REQUIRE(s.client->Set("start", "1").ok());
  const int64_t rev0 = s.server->backend()->revision();
  absl::Mutex mu;
  std::vector<int64_t> seen;
  std::vector<std::thread> ts;
  for (int t = 0; t < kConns; ++t) {
    ts.emplace_back([&] {
      auto c = Client::Connect(ClientOptions{.address = s.server->address()});
      REQUIRE(c.ok());
      for (int i = 0; i < kAdds; ++i) {
        auto v = c->Add("hot", i % 2 == 0 ? 1 : 2);  // mixed deltas: order matters
        REQUIRE(v.ok());
        absl::MutexLock l(&mu);
        seen.push_back(*v);
      }
    });
  }
  for (auto& t : ts) t.join();
  // Every add saw a distinct total, and the last total is the sum of all deltas.
  std::sort(seen.begin(), seen.end());
  REQUIRE(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
  REQUIRE(seen.back() == kConns * (kAdds / 2) * 3);
  REQUIRE(*s.client->Get("hot") == absl::StrCat(kConns * (kAdds / 2) * 3));
  // Combined: fewer etcd writes (revisions) than adds. Uncombined it would be exactly one each.
  const int64_t writes = s.server->backend()->revision() - rev0;
  INFO(writes << " etcd writes for " << kConns * kAdds << " adds");
  CHECK(writes < kConns * kAdds);
}

TEST_CASE("a watch resumes across an etcd restart with no gap and no duplicate") {
  EtcdTestCluster etcd(1);
  EtcdStore s(etcd.endpoints());
  Client& c = *s.client;
  REQUIRE(c.Set("w/k", "start").ok());
  absl::Mutex mu;
  std::vector<WatchEvent> events;
  auto watch = c.WatchPrefix("w/", [&](const WatchEvent& e) {
    absl::MutexLock l(&mu);
    events.push_back(e);
  });
  REQUIRE(watch.ok());
  for (int i = 0; i < 100; ++i) REQUIRE(c.Set("w/k", std::to_string(i)).ok());
  etcd.Kill(0);
  etcd.Restart(0);
  for (int i = 100; i < 200; ++i) REQUIRE(c.Set("w/k", std::to_string(i)).ok());  // retried
  auto all = [&] {
    absl::MutexLock l(&mu);
    return events.size() >= 200;
  };
  for (int i = 0; i < 1000 && !all(); ++i) absl::SleepFor(absl::Milliseconds(10));
  absl::SleepFor(absl::Milliseconds(200));  // a duplicate would arrive now
  (*watch)->Cancel();
  absl::MutexLock l(&mu);
  REQUIRE(events.size() == 200);
  for (int i = 0; i < 200; ++i) {
    REQUIRE(events[i].value == std::to_string(i));
    if (i > 0) REQUIRE(events[i].revision > events[i - 1].revision);
  }
}

TEST_CASE("with etcd down an op fails within its deadline naming the endpoints, then recovers") {
  EtcdTestCluster etcd(1);
  EtcdStore s(etcd.endpoints(), "/t/", absl::Seconds(2));
  Client& c = *s.client;
  REQUIRE(c.Set("k", "v").ok());
  etcd.Kill(0);
  const absl::Time start = absl::Now();
  absl::Status st = c.Set("k", "w");
  const absl::Duration took = absl::Now() - start;
  INFO(st.ToString());
  REQUIRE(absl::IsUnavailable(st));
  REQUIRE(st.message().find(etcd.endpoints()[0]) != std::string::npos);
  REQUIRE(took < absl::Seconds(5));
  REQUIRE(absl::IsUnavailable(c.Add("n", 1).status()));
  etcd.Restart(0);
  REQUIRE(etcd.WaitHealthy(20));
  REQUIRE(c.Set("k", "x").ok());
  REQUIRE(*c.Get("k") == "x");
}

TEST_CASE("etcd user/password auth: the right password works, a wrong one fails naming the user") {
  EtcdTestCluster etcd(1);
  const std::string ctl =
      absl::StrCat("ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=", etcd.endpoints()[0], " ");
  REQUIRE(std::system((ctl + "user add root --new-user-password=s3cret >/dev/null 2>&1").c_str()) == 0);
  REQUIRE(std::system((ctl + "auth enable >/dev/null").c_str()) == 0);
  {
    EtcdStore s(etcd.endpoints(), "/t/", absl::Seconds(15), "root", "s3cret");
    REQUIRE(s.client->Set("k", "v").ok());
    std::thread setter([&] {
      absl::SleepFor(absl::Milliseconds(200));
      REQUIRE(s.client->Set("late", "1").ok());
    });
    auto late = s.client->Get("late", {.wait = true, .timeout = absl::Seconds(10)});  // watch
    setter.join();
    REQUIRE(late.ok());
    REQUIRE(*s.client->Get("k") == "v");
  }
  EtcdOptions e;
  e.endpoints = etcd.endpoints();
  e.user = "root";
  e.password = "wrong";
  auto b = NewEtcdBackend(e, BackendOptions{});
  REQUIRE_FALSE(b.ok());
  INFO(b.status().ToString());
  REQUIRE(b.status().message().find("user 'root'") != std::string::npos);
  REQUIRE(b.status().message().find("wrong") == std::string::npos);  // never the password
}

TEST_CASE("ember-store --backend=etcd keeps its keys in etcd under --etcd-prefix") {
  EtcdTestCluster etcd(1);
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string port_file = absl::StrCat(dir, "/etcd-store-port-", getpid());
  unlink(port_file.c_str());
  std::vector<std::string> args = {testing::StoreBinary(), "--listen=127.0.0.1:0",
                                   "--insecure-no-auth", "--backend=etcd",
                                   "--etcd-endpoints=http://" + etcd.endpoints()[0],
                                   "--etcd-prefix=/cli/", "--port-file=" + port_file,
                                   "--log_level=warn"};
  const pid_t pid = testing::SpawnChild(std::move(args));
  const int port = testing::WaitPort(port_file);
  auto c = Client::Connect(ClientOptions{.address = absl::StrCat("127.0.0.1:", port)});
  REQUIRE(c.ok());
  REQUIRE(c->Set("k", "from-cli").ok());
  const std::string got = [&] {
    std::string out;
    FILE* p = popen(absl::StrCat("ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=", etcd.endpoints()[0],
                                 " get /cli/k --print-value-only").c_str(), "r");
    char buf[256];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    pclose(p);
    return out;
  }();
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  REQUIRE(got == "from-cli\n");
}

TEST_CASE("kill -9 of the etcd leader under a write load loses no acknowledged write") {
  EtcdTestCluster etcd(3);
  // The store talks to the leader first: its connection is the one that breaks.
  const int leader = etcd.Leader();
  REQUIRE(leader >= 0);
  std::vector<std::string> endpoints = etcd.endpoints();
  std::rotate(endpoints.begin(), endpoints.begin() + leader, endpoints.end());
  EtcdStore s(endpoints);
  constexpr int kWriters = 4;
  std::atomic<bool> stop{false};
  std::vector<std::atomic<int>> acked(kWriters);
  std::atomic<int64_t> adds_ok{0}, adds_failed{0}, set_errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kWriters; ++t) {
    ts.emplace_back([&, t] {
      Client c = *Client::Connect(ClientOptions{.address = s.server->address()});
      for (int i = 0; !stop; ++i) {
        // Each Set is acknowledged only after a retry succeeded, or fails: count the ok ones.
        if (c.Set(absl::StrCat("k/", t, "/", i), absl::StrCat(i)).ok()) {
          acked[t] = i + 1;
        } else {
          ++set_errors;
          break;  // a later key must not be acked after a missing earlier one (kept simple)
        }
        (c.Add("counter", 1).ok() ? adds_ok : adds_failed)++;
      }
    });
  }
  absl::SleepFor(absl::Seconds(2));
  REQUIRE(etcd.Leader() == leader);
  std::vector<int> at_kill(kWriters);
  for (int t = 0; t < kWriters; ++t) at_kill[t] = acked[t];
  etcd.Kill(leader);
  // Writes go on once the survivors elected a leader (in-flight ones retry within the deadline).
  auto all_progressed = [&] {
    for (int t = 0; t < kWriters; ++t) {
      if (acked[t] <= at_kill[t] + 20 && set_errors == 0) return false;
    }
    return true;
  };
  for (int i = 0; i < 300 && !all_progressed(); ++i) absl::SleepFor(absl::Milliseconds(100));
  stop = true;
  for (auto& t : ts) t.join();
  REQUIRE(set_errors == 0);  // leader loss is retried within the op deadline
  Client& c = *s.client;
  int64_t total = 0;
  for (int t = 0; t < kWriters; ++t) {
    INFO("writer " << t << " acked " << acked[t] << " (at kill " << at_kill[t] << ")");
    REQUIRE(acked[t] > at_kill[t]);  // writes went on after the leader died
    for (int i = 0; i < acked[t]; ++i) {
      auto v = c.Get(absl::StrCat("k/", t, "/", i));
      REQUIRE(v.ok());
      REQUIRE(*v == absl::StrCat(i));
    }
    total += acked[t];
  }
  // An Add whose outcome was unknown may or may not be in the total, never twice.
  const int64_t counter = *c.Add("counter", 0);
  REQUIRE(counter >= adds_ok);
  REQUIRE(counter <= adds_ok + adds_failed);
  // The killed member catches up after a restart: read everything through it alone.
  etcd.Restart(leader);
  REQUIRE(etcd.WaitHealthy(30));
  EtcdStore only(std::vector<std::string>{etcd.endpoints()[leader]});
  for (int t = 0; t < kWriters; ++t) {
    REQUIRE(*only.client->NumKeys(absl::StrCat("k/", t, "/")) == acked[t]);
  }
  WARN("verified " << total << " acknowledged writes across kill -9 of the leader; adds ok="
                   << adds_ok << " outcome unknown=" << adds_failed);
}

}  // namespace
}  // namespace ember::store
