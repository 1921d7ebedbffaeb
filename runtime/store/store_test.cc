// Store semantics against an in-process server over real gRPC on loopback. The same cases run on
// the etcd backend (store_etcd_suite_test, see store_test_backend.h), except those tagged
// [fake_clock] (etcd leases expire on etcd's clock) and [load] (minutes on etcd; smaller
// concurrent-Add cases on etcd are in store_etcd_test.cc).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <limits>
#include <string>
#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "runtime/base/clock.h"
#include "runtime/store/client.h"
#include "runtime/store/client_grpc.h"
#include "runtime/store/server.h"
#include "runtime/store/store_test_backend.h"

namespace ember::store {
namespace {

struct Fixture {
  explicit Fixture(StoreServerOptions opts = {}, int transport = 0) {
    testing::UseTestBackend(&opts);  // in-memory or etcd, per test binary (store_test_backend.h)
    auto s = StoreServer::Start(std::move(opts));
    REQUIRE(s.ok());
    server = std::move(*s);
    options.address = server->address();
    options.auth_token = token;
    options.use_fast_path = transport != 2;  // 0: fast path over Unix socket, 1: TCP, 2: gRPC
    options.use_unix_socket = transport == 0;
    client = std::make_unique<Client>(Connect());
  }
  // A new client with its own connection, same transport.
  Client Connect() {
    auto c = Client::Connect(options);
    REQUIRE(c.ok());
    return *c;
  }
  std::string token;
  ClientOptions options;
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<Client> client;
};

int ThreadCount() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

TEST_CASE("set, get, delete and not-found") {
  const int transport = GENERATE(0, 1, 2);
  INFO("transport: " << (transport == 0 ? "unix" : transport == 1 ? "tcp" : "grpc stream"));
  Fixture f({}, transport);
  Client& c = *f.client;
  REQUIRE(c.Set("a", std::string("x\0y", 3)).ok());
  auto v = c.Get("a");
  REQUIRE(v.ok());
  REQUIRE(*v == std::string("x\0y", 3));
  REQUIRE(absl::IsNotFound(c.Get("missing").status()));
  REQUIRE(*c.Delete("a"));
  REQUIRE_FALSE(*c.Delete("a"));
  REQUIRE(absl::IsNotFound(c.Get("a").status()));
}

TEST_CASE("blocking get wakes when the key is set, and times out naming the key") {
  const int transport = GENERATE(0, 1, 2);
  INFO("transport: " << (transport == 0 ? "unix" : transport == 1 ? "tcp" : "grpc stream"));
  Fixture f({}, transport);
  Client& c = *f.client;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    REQUIRE(c.Set("late", "v").ok());
  });
  auto v = c.Get("late", {.wait = true, .timeout = absl::Seconds(10)});
  setter.join();
  REQUIRE(v.ok());
  REQUIRE(*v == "v");
  auto t = c.Get("never", {.wait = true, .timeout = absl::Milliseconds(200)});
  REQUIRE(absl::IsDeadlineExceeded(t.status()));
  REQUIRE(t.status().message().find("never") != std::string::npos);
}

TEST_CASE("64 threads x 1000 Add give the exact total", "[load]") {
  const int transport = GENERATE(0, 1, 2);
  INFO("transport: " << (transport == 0 ? "unix" : transport == 1 ? "tcp" : "grpc stream"));
  Fixture f({}, transport);
  std::vector<std::thread> ts;
  std::atomic<int> errors{0};
  for (int i = 0; i < 64; ++i) {
    ts.emplace_back([&] {
      for (int j = 0; j < 1000; ++j) {
        if (!f.client->Add("counter", 1).ok()) ++errors;
      }
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(errors == 0);
  REQUIRE(*f.client->Add("counter", 0) == 64000);
  REQUIRE(*f.client->Get("counter") == "64000");
  REQUIRE(f.client->Set("text", "abc").ok());
  REQUIRE(absl::IsInvalidArgument(f.client->Add("text", 1).status()));
}

TEST_CASE("pipelined adds: 8 connections x 5000 adds, 16 in flight each, give the exact total",
          "[load]") {
  const int transport = GENERATE(0, 1, 2);
  INFO("transport: " << (transport == 0 ? "unix" : transport == 1 ? "tcp" : "grpc stream"));
  Fixture f({}, transport);
  constexpr int kThreads = 8, kAdds = 5000, kWindow = 16;
  std::vector<std::thread> ts;
  std::atomic<int> errors{0}, answered{0}, out_of_order{0};
  for (int i = 0; i < kThreads; ++i) {
    // Threads 0-5 each have their own connection; 6 and 7 share the fixture's (two pipelines and
    // their callbacks on one connection).
    Client c = i < 6 ? f.Connect() : *f.client;
    ts.emplace_back([&, c] {
      Pipeline p(c, kWindow);
      int64_t last = 0;  // this pipeline's answers are in its own order: each total is higher
      for (int j = 0; j < kAdds; ++j) {
        p.Add("counter", 1, [&](absl::StatusOr<int64_t> v) {
          if (!v.ok()) return (void)++errors;
          if (*v <= last) ++out_of_order;
          last = *v;
          ++answered;
        });
      }
      if (!p.Drain().ok()) ++errors;
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(errors == 0);
  REQUIRE(out_of_order == 0);
  REQUIRE(answered == kThreads * kAdds);
  REQUIRE(*f.client->Get("counter") == std::to_string(kThreads * kAdds));
}

TEST_CASE("a pipeline answers in request order, each op on its own") {
  const int transport = GENERATE(0, 1, 2);
  INFO("transport: " << (transport == 0 ? "unix" : transport == 1 ? "tcp" : "grpc stream"));
  Fixture f({}, transport);
  Client& c = *f.client;
  REQUIRE(c.Set("text", "abc").ok());
  // Calls 0..1999 on one pipeline, window 16: adds on "n", except every 100th is a Set of its
  // own key and every 100th + 50 is an Add on the non-integer "text" (INVALID_ARGUMENT).
  std::vector<int> order;  // call index, in the order the callbacks ran
  std::vector<int64_t> totals;
  std::vector<absl::Status> status(2000);
  {
    Pipeline p(c, 16);
    for (int i = 0; i < 2000; ++i) {
      if (i % 100 == 0) {
        p.Set(absl::StrCat("s/", i), absl::StrCat(i), [&, i](absl::Status s) {
          order.push_back(i);
          status[i] = s;
        });
      } else {
        p.Add(i % 100 == 50 ? "text" : "n", 1, [&, i](absl::StatusOr<int64_t> v) {
          order.push_back(i);
          status[i] = v.status();
          if (v.ok()) totals.push_back(*v);
        });
      }
    }
    absl::Status first = p.Drain();
    REQUIRE(absl::IsInvalidArgument(first));  // the first failed op's error
    REQUIRE(first.message().find("text") != std::string::npos);
    REQUIRE(p.Drain().ok());  // reported once
  }
  REQUIRE(order.size() == 2000);
  for (int i = 0; i < 2000; ++i) {
    INFO("call " << i);
    REQUIRE(order[i] == i);
    REQUIRE(absl::IsInvalidArgument(status[i]) == (i % 100 == 50));
  }
  REQUIRE(totals.size() == 2000 - 20 - 20);
  for (size_t k = 0; k < totals.size(); ++k) REQUIRE(totals[k] == static_cast<int64_t>(k) + 1);
  REQUIRE(*c.Get("text") == "abc");
  REQUIRE(*c.Get("s/1900") == "1900");
  REQUIRE(*c.NumKeys("s/") == 20);

  // AddAsync: several in flight without a Pipeline; answers come on an internal thread.
  absl::Mutex mu;
  int done = 0;
  std::vector<int64_t> async_totals;
  for (int i = 0; i < 500; ++i) {
    c.AddAsync("async", 2, [&](absl::StatusOr<int64_t> v) {
      absl::MutexLock l(&mu);
      async_totals.push_back(v.ok() ? *v : -1);
      ++done;
    });
  }
  {
    absl::MutexLock l(&mu);
    auto all = [&] { return done == 500; };
    REQUIRE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60)));
  }
  std::sort(async_totals.begin(), async_totals.end());
  for (int i = 0; i < 500; ++i) REQUIRE(async_totals[i] == 2 * (i + 1));
}

TEST_CASE("compare-set swaps only on a match") {
  Fixture f;
  Client& c = *f.client;
  auto r = c.CompareSet("k", std::nullopt, "v1");
  REQUIRE(r->swapped);
  r = c.CompareSet("k", std::nullopt, "v2");
  REQUIRE_FALSE(r->swapped);
  REQUIRE(r->current == "v1");
  r = c.CompareSet("k", std::string("wrong"), "v2");
  REQUIRE_FALSE(r->swapped);
  r = c.CompareSet("k", std::string("v1"), "v2");
  REQUIRE(r->swapped);
  REQUIRE(*c.Get("k") == "v2");
}

TEST_CASE("wait on several keys wakes when the last appears; timeout names the missing ones") {
  Fixture f;
  Client& c = *f.client;
  REQUIRE(c.Set("w1", "1").ok());
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(50));
    REQUIRE(c.Set("w2", "2").ok());
    absl::SleepFor(absl::Milliseconds(50));
    REQUIRE(c.Set("w3", "3").ok());
  });
  REQUIRE(c.Wait({"w1", "w2", "w3"}, absl::Seconds(10)).ok());
  t.join();
  absl::Status s = c.Wait({"w1", "gone1", "gone2"}, absl::Milliseconds(150));
  REQUIRE(absl::IsDeadlineExceeded(s));
  REQUIRE(s.message().find("gone1") != std::string::npos);
  REQUIRE(s.message().find("gone2") != std::string::npos);
  REQUIRE(s.message().find("w1,") == std::string::npos);
}

TEST_CASE("check, prefix ops, multi get/set, append, list") {
  const int transport = GENERATE(0, 1, 2);
  INFO("transport: " << (transport == 0 ? "unix" : transport == 1 ? "tcp" : "grpc stream"));
  Fixture f({}, transport);
  Client& c = *f.client;
  REQUIRE(c.MultiSet({{"p/a", "1"}, {"p/b", "2"}, {"q/c", "3"}}).ok());
  REQUIRE(*c.Check({"p/a", "p/b"}));
  REQUIRE_FALSE(*c.Check({"p/a", "p/z"}));
  REQUIRE(*c.NumKeys() == 3);
  REQUIRE(*c.NumKeys("p/") == 2);
  auto mg = c.MultiGet({"p/a", "nope", "q/c"});
  REQUIRE(mg->size() == 3);
  REQUIRE((*mg)[0] == std::optional<std::string>("1"));
  REQUIRE_FALSE((*mg)[1].has_value());
  REQUIRE((*mg)[2] == std::optional<std::string>("3"));
  REQUIRE(*c.Append("log", "ab") == 2);
  REQUIRE(*c.Append("log", "cde") == 5);
  REQUIRE(*c.Get("log") == "abcde");
  auto keys = c.ListKeys("p/");
  REQUIRE(*keys == std::vector<std::string>{"p/a", "p/b"});
  REQUIRE(*c.DeletePrefix("p/") == 2);
  REQUIRE(*c.NumKeys("p/") == 0);
  // Prefix views scope every key and strip the prefix from listings.
  Client job = c.WithPrefix("jobs/j1/");
  REQUIRE(job.Set("x", "1").ok());
  REQUIRE(*c.Get("jobs/j1/x") == "1");
  REQUIRE(*job.ListKeys() == std::vector<std::string>{"x"});
  // A blocking MultiGet returns once all exist.
  std::thread t([&] { REQUIRE(c.Set("m2", "b").ok()); });
  REQUIRE(c.Set("m1", "a").ok());
  auto all = c.MultiGet({"m1", "m2"}, {.wait = true, .timeout = absl::Seconds(10)});
  t.join();
  REQUIRE(all.ok());
  REQUIRE(*(*all)[1] == "b");
}

TEST_CASE("watch sees every change under its prefix, in order") {
  Fixture f;
  Client& c = *f.client;
  REQUIRE(c.Set("w/existing", "0").ok());
  absl::Mutex mu;
  std::vector<WatchEvent> events;
  auto watch = c.WatchPrefix(
      "w/",
      [&](const WatchEvent& e) {
        absl::MutexLock l(&mu);
        events.push_back(e);
      },
      /*send_initial=*/true);
  REQUIRE(watch.ok());
  constexpr int kN = 2000;
  std::thread writer([&] {
    for (int i = 0; i < kN; ++i) REQUIRE(c.Set("w/k", std::to_string(i)).ok());
    REQUIRE(c.Set("other/ignored", "x").ok());
    REQUIRE(*c.Delete("w/k"));
  });
  writer.join();
  auto got_all = [&] {
    absl::MutexLock l(&mu);
    return events.size() >= kN + 2;
  };
  for (int i = 0; i < 6000 && !got_all(); ++i) absl::SleepFor(absl::Milliseconds(10));  // <= 60 s loaded
  (*watch)->Cancel();
  absl::MutexLock l(&mu);
  REQUIRE(events.size() == kN + 2);
  REQUIRE(events[0].key == "w/existing");
  for (int i = 0; i < kN; ++i) {
    REQUIRE(events[i + 1].key == "w/k");
    REQUIRE(events[i + 1].value == std::to_string(i));
    REQUIRE(events[i + 1].revision > events[i].revision);
  }
  REQUIRE(events.back().type == WatchEvent::Type::kDelete);
}

TEST_CASE("leased keys expire unless refreshed", "[fake_clock]") {
  base::FakeClock clock;
  StoreServerOptions opts;
  opts.clock = &clock;
  Fixture f(opts);
  Client& c = *f.client;
  auto lease = c.GrantLease(absl::Seconds(10));
  REQUIRE(lease.ok());
  REQUIRE(c.SetWithLease("nodes/a", "alive", *lease).ok());
  auto other = c.GrantLease(absl::Seconds(10));
  REQUIRE(c.SetWithLease("nodes/b", "alive", *other).ok());
  clock.Advance(absl::Seconds(6));
  REQUIRE(c.RefreshLease(*lease).ok());
  clock.Advance(absl::Seconds(6));  // b's lease is now 12 s old, a's 6 s since refresh
  for (int i = 0; i < 200 && c.Get("nodes/b").ok(); ++i) absl::SleepFor(absl::Milliseconds(10));
  REQUIRE(absl::IsNotFound(c.Get("nodes/b").status()));
  REQUIRE(c.Get("nodes/a").ok());
  REQUIRE(absl::IsNotFound(c.RefreshLease(*other)));
  REQUIRE(absl::IsNotFound(c.SetWithLease("nodes/c", "x", *other)));
  REQUIRE(c.RevokeLease(*lease).ok());
  REQUIRE(absl::IsNotFound(c.Get("nodes/a").status()));
}

TEST_CASE("key and value size limits give INVALID_ARGUMENT naming the limit") {
  StoreServerOptions opts;
  opts.backend.max_key_bytes = 64;
  opts.backend.max_value_bytes = 1024;
  Fixture f(opts);
  absl::Status s = f.client->Set(std::string(65, 'k'), "v");
  REQUIRE(absl::IsInvalidArgument(s));
  REQUIRE(s.message().find("max_key_bytes=64") != std::string::npos);
  s = f.client->Set("k", std::string(1025, 'v'));
  REQUIRE(absl::IsInvalidArgument(s));
  REQUIRE(s.message().find("max_value_bytes=1024") != std::string::npos);
  REQUIRE(f.client->Set("k", std::string(1024, 'v')).ok());
  REQUIRE(absl::IsInvalidArgument(f.client->Append("k", "x").status()));
}

TEST_CASE("a key that is not UTF-8 is INVALID_ARGUMENT naming the byte, on every transport") {
  for (int transport : {0, 1, 2}) {
    INFO("transport " << transport);
    Fixture f({}, transport);
    const std::string bad = std::string("jobs/a\xff\xfe/x");
    for (absl::Status s : {f.client->Set(bad, "v"), f.client->Add(bad, 1).status(),
                           f.client->Get(bad).status(), f.client->Delete(bad).status()}) {
      INFO(s);
      REQUIRE(absl::IsInvalidArgument(s));
      REQUIRE(s.message().find("not valid UTF-8") != std::string::npos);
      REQUIRE(s.message().find("byte 6") != std::string::npos);
    }
    // A truncated multi-byte sequence and an overlong encoding are refused too; valid UTF-8
    // (multi-byte included) is a key like any other.
    REQUIRE(absl::IsInvalidArgument(f.client->Set("k\xc3", "v")));
    REQUIRE(absl::IsInvalidArgument(f.client->Set("k\xc0\xaf", "v")));
    REQUIRE(f.client->Set("caf\xc3\xa9/\xe2\x82\xac", "v").ok());
    REQUIRE(*f.client->Get("caf\xc3\xa9/\xe2\x82\xac") == "v");
    // The server is still serving.
    REQUIRE(f.client->Set("k", "v").ok());
  }
}

TEST_CASE("fenced writes are refused once the fence passes their epoch, on every transport") {
  for (int transport : {0, 1, 2}) {
    INFO("transport " << transport);
    Fixture f({}, transport);
    ClientOptions o0 = f.options, o1 = f.options;
    o0.fence_key = o1.fence_key = "jobs/j/fence";
    o0.fence_epoch = 0;
    o1.fence_epoch = 1;
    auto c0 = Client::Connect(o0), c1 = Client::Connect(o1);
    REQUIRE(c0.ok());
    REQUIRE(c1.ok());
    REQUIRE(c0->Set("jobs/j/a", "old").ok());  // no fence key yet: epoch 0 may write
    REQUIRE(f.client->Set("jobs/j/fence", "1").ok());  // the owner of epoch 1 takes over
    std::vector<absl::Status> refused = {
        c0->Set("jobs/j/a", "stale"), c0->Add("jobs/j/n", 1).status(),
        c0->CompareSet("jobs/j/a", std::string("old"), "x").status(),
        c0->Delete("jobs/j/a").status(), c0->MultiSet({{"jobs/j/a", "x"}, {"jobs/j/b", "y"}}),
        c0->Append("jobs/j/a", "x").status(), c0->DeletePrefix("jobs/j/").status(),
        c0->WithPrefix("jobs/j/next/").Set("rec/0", "x")};
    for (const absl::Status& s : refused) {
      INFO(s);
      REQUIRE(IsFenced(s));
      REQUIRE(s.message().find("belongs to epoch 0, the fence is at epoch 1") != std::string::npos);
    }
    // Nothing changed; reads still work for the stale client; the current epoch writes.
    REQUIRE(*c0->Get("jobs/j/a") == "old");
    REQUIRE(absl::IsNotFound(f.client->Get("jobs/j/b").status()));
    REQUIRE(absl::IsNotFound(f.client->Get("jobs/j/n").status()));
    REQUIRE(c1->Set("jobs/j/a", "new").ok());
    REQUIRE(*f.client->Get("jobs/j/a") == "new");
    // An unfenced client is not affected; a fence that is not a number refuses fenced writes.
    REQUIRE(f.client->Set("jobs/j/fence", "two").ok());
    absl::Status bad = c1->Set("jobs/j/a", "x");
    REQUIRE(IsFenced(bad));
    REQUIRE(bad.message().find("not an integer epoch") != std::string::npos);
    REQUIRE(!IsFenced(absl::FailedPreconditionError("other")));
  }
}

TEST_CASE("Add past INT64_MAX or below INT64_MIN is OUT_OF_RANGE and leaves the value") {
  for (int transport : {0, 2}) {
    INFO("transport " << transport);
    Fixture f({}, transport);
    const int64_t max = std::numeric_limits<int64_t>::max();
    const int64_t min = std::numeric_limits<int64_t>::min();
    REQUIRE(*f.client->Add("c", max - 1) == max - 1);
    REQUIRE(*f.client->Add("c", 1) == max);
    auto r = f.client->Add("c", 1);
    INFO(r.status());
    REQUIRE(absl::IsOutOfRange(r.status()));
    REQUIRE(r.status().message().find("'c'") != std::string::npos);
    REQUIRE(r.status().message().find("9223372036854775807 + 1") != std::string::npos);
    REQUIRE(*f.client->Get("c") == std::to_string(max));  // unchanged, not wrapped
    REQUIRE(absl::IsOutOfRange(f.client->Add("c", max).status()));
    REQUIRE(*f.client->Add("d", min) == min);
    r = f.client->Add("d", -1);
    REQUIRE(absl::IsOutOfRange(r.status()));
    REQUIRE(r.status().message().find("-9223372036854775808 + -1") != std::string::npos);
    REQUIRE(*f.client->Add("d", max) == -1);  // in range: fine
  }
}

// The gRPC stream's last callback (SessionStream::OnDone, on a "nexting" thread of gRPC 1.51's
// process-wide callback queue) deletes the stream, whose ClientContext holds a reference to the
// channel. If the client and then the server were torn down before that delete, the channel's last
// reference went on that thread: ~Channel released the queue's last user, the queue's teardown
// joined its own thread (a failed self-join) and freed the queue, and the thread went on polling
// the freed queue: SIGABRT now and then ("ref_counted.h:183 assertion failed: prior > 0"), right
// after a fixture's teardown. The hook holds the delete back; the client's teardown must wait for
// it (so the channel's last reference goes on this thread), and a server and client started next
// must work. (Without the wait, the teardown returns at once and this binary aborts in some runs.)
TEST_CASE("a gRPC-stream client's teardown waits for its stream's last callback") {
  constexpr absl::Duration kDelay = absl::Milliseconds(500);
  client_internal::SetStreamDeleteDelayForTest(kDelay);
  {
    Fixture f({}, /*transport=*/2);
    REQUIRE(f.client->Set("k", "v").ok());
    const absl::Time start = absl::Now();
    f.client.reset();  // cancels the stream; returns once the stream (and its context) is deleted
    const absl::Duration took = absl::Now() - start;
    INFO("the client's teardown took " << absl::FormatDuration(took));
    CHECK(took >= kDelay - absl::Milliseconds(50));
  }  // then the server
  client_internal::SetStreamDeleteDelayForTest(absl::ZeroDuration());
  absl::SleepFor(kDelay + absl::Milliseconds(300));  // (an early teardown's late delete runs by now)
  Fixture g({}, /*transport=*/2);
  REQUIRE(g.client->Set("k", "w").ok());
  REQUIRE(*g.client->Get("k") == "w");
}

TEST_CASE("a wrong token is rejected with UNAUTHENTICATED and changes nothing") {
  StoreServerOptions opts;
  opts.auth_token = "s3cret";
  auto server = StoreServer::Start(opts);
  REQUIRE(server.ok());
  ClientOptions good{.address = (*server)->address(), .auth_token = "s3cret"};
  ClientOptions bad{.address = (*server)->address(), .auth_token = "guess"};
  bad.connect_timeout = absl::Seconds(5);
  auto b = Client::Connect(bad);
  REQUIRE(absl::IsUnauthenticated(b.status()));
  bad.use_fast_path = false;
  REQUIRE(absl::IsUnauthenticated(Client::Connect(bad).status()));
  ClientOptions none{.address = (*server)->address()};
  REQUIRE(absl::IsUnauthenticated(Client::Connect(none).status()));
  auto g = Client::Connect(good);
  REQUIRE(g.ok());
  REQUIRE(*g->NumKeys() == 0);
  // A raw socket on the fast path without the token is refused and closed.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons((*server)->fast_port());
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  const char hello[4] = {0, 0, 0, 0};  // empty RequestBatch: no token
  REQUIRE(send(fd, hello, 4, MSG_NOSIGNAL) == 4);
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof(buf), 0);
  REQUIRE(n > 4);                      // the UNAUTHENTICATED reply
  REQUIRE(recv(fd, buf, sizeof(buf), 0) == 0);  // then EOF
  close(fd);
}

TEST_CASE("thousands of blocked gets hold no thread each, and all wake") {
  const int transport = GENERATE(0, 1, 2);
  INFO("transport: " << (transport == 0 ? "unix" : transport == 1 ? "tcp" : "grpc stream"));
  Fixture f({}, transport);
  Client& c = *f.client;
  int threads_before = ThreadCount();
  constexpr int kWaiters = 3000;
  std::atomic<int> woke{0}, failed{0};
  for (int i = 0; i < kWaiters; ++i) {
    c.GetAsync(
        "gate/" + std::to_string(i % 10),
        [&](absl::StatusOr<std::string> v) { (v.ok() ? woke : failed)++; },
        {.wait = true, .timeout = absl::Seconds(60)});
  }
  for (int i = 0; i < 6000 && f.server->backend()->num_waiters() < kWaiters; ++i) {  // <= 60 s
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE(f.server->backend()->num_waiters() == kWaiters);
  // Server and client together: a handful of threads, not thousands.
  REQUIRE(ThreadCount() - threads_before < 64);
  for (int k = 0; k < 10; ++k) REQUIRE(c.Set("gate/" + std::to_string(k), "open").ok());
  for (int i = 0; i < 6000 && woke + failed < kWaiters; ++i) absl::SleepFor(absl::Milliseconds(10));
  REQUIRE(woke == kWaiters);
  REQUIRE(failed == 0);
}

TEST_CASE("barrier releases all participants together") {
  Fixture f;
  constexpr int kN = 16;
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < kN; ++i) {
    ts.emplace_back([&] {
      if (f.client->Barrier("b1", kN, absl::Seconds(30)).ok()) ++ok;
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(ok == kN);
  absl::Status s = f.client->Barrier("b2", 3, absl::Milliseconds(200));
  REQUIRE(absl::IsDeadlineExceeded(s));
  REQUIRE(s.message().find("1 of 3") != std::string::npos);
}

TEST_CASE("garbage bytes and half-open connections never wedge the server") {
  Fixture f;
  std::mt19937 rng(7);
  std::vector<int> idle;
  for (int round = 0; round < 20; ++round) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    // Alternate between the gRPC port and the fast-path port.
    addr.sin_port = htons(round % 4 < 2 ? f.server->port() : f.server->fast_port());
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    if (round == 6) {
      const unsigned char huge[4] = {0xff, 0xff, 0xff, 0x7f};  // a 2 GiB frame header
      REQUIRE(send(fd, huge, 4, MSG_NOSIGNAL) == 4);
      close(fd);
    } else if (round % 2 == 0) {
      std::string junk(4096, '\0');
      for (char& ch : junk) ch = static_cast<char>(rng());
      if (round == 4) junk = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + junk;  // valid preface, bad frames
      ssize_t n = send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
      (void)n;
      close(fd);
    } else {
      idle.push_back(fd);  // connected, silent: a half-open peer
    }
  }
  REQUIRE(f.client->Set("after-garbage", "ok").ok());
  REQUIRE(*f.client->Get("after-garbage") == "ok");
  // A second, fresh client still connects and works while the silent sockets stay open.
  auto c2 = Client::Connect({.address = f.server->address()});
  REQUIRE(c2.ok());
  REQUIRE(*c2->Get("after-garbage") == "ok");
  for (int fd : idle) close(fd);
}

TEST_CASE("unreachable server gives UNAVAILABLE naming the address") {
  ClientOptions o{.address = "127.0.0.1:1"};
  o.connect_timeout = absl::Milliseconds(300);
  auto c = Client::Connect(o);
  REQUIRE(absl::IsUnavailable(c.status()));
  REQUIRE(c.status().message().find("127.0.0.1:1") != std::string::npos);
}

}  // namespace
}  // namespace ember::store
