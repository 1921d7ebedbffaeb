// TcpStoreServer's bounds against clients that never authenticate (issue 31): parked WAITs are
// charged to the listener's budget and freed on close, a WAIT over max_wait_bytes is refused,
// silent sockets are evicted from a full table and time out under pressure while real clients
// keep being served, a half-sent query times out, and a flood of malformed connections logs a
// warning a second with the count of the rest.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/store/server.h"
#include "runtime/store/tcpstore_server.h"
#include "runtime/store/tcpstore_test_wire.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"

namespace ember::store {
namespace {

using testing::Serve;
using testing::Served;
using testing::Wire;

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;
// torch 1.13 query types.
constexpr uint8_t kSet = 0, kAdd = 3, kWait = 5;

// Whether the server closed `w` within `within` (EOF or reset); false if it is still open.
bool ClosedWithin(Wire& w, absl::Duration within) {
  pollfd pf{w.fd(), POLLIN, 0};
  if (poll(&pf, 1, static_cast<int>(absl::ToInt64Milliseconds(within))) <= 0) return false;
  char c;
  return recv(w.fd(), &c, 1, MSG_DONTWAIT) <= 0;
}

// An ADD on `w` answered with the running total (a client that is being served).
int64_t Add(Wire& w, const std::string& key, int64_t by) {
  REQUIRE(w.U8(kAdd).Str(key).U64(static_cast<uint64_t>(by)).Send());
  return w.ReadI64();
}

// Queues a 1.13 WAIT on `n` keys of 4000 bytes each (the store's keys are at most 4 KiB) that
// nobody sets.
void AppendWait(Wire& w, const std::string& tag, int n) {
  w.U8(kWait).U64(static_cast<uint64_t>(n));
  for (int k = 0; k < n; ++k) {
    std::string key = absl::StrCat("/", tag, "-", k, "-");
    key.resize(4000, 'k');
    w.Str(key);
  }
}

bool Eventually(const std::function<bool()>& f, absl::Duration within) {
  const absl::Time end = absl::Now() + within;
  while (absl::Now() < end) {
    if (f()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return f();
}

TEST_CASE("parked WAITs are charged to the listener's budget and freed on close") {
  TcpStoreOptions o;
  o.max_buffered_bytes = 8 * kMiB;
  Served s = Serve(o);
  // 12 WAITs of 900 KB of keys each on keys nobody sets: 10.3 MiB against an 8 MiB budget.
  constexpr int kWaiters = 12;
  const int64_t key_bytes = 225 * 4000;
  std::vector<std::unique_ptr<Wire>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    auto w = std::make_unique<Wire>(s.tcp->port());
    REQUIRE(w->connected());
    AppendWait(*w, absl::StrCat("wait", i), 225);
    REQUIRE(w->Send());
    waiters.push_back(std::move(w));
  }
  // A small client is served meanwhile.
  Wire small(s.tcp->port());
  REQUIRE(small.connected());
  CHECK(Add(small, "/counter", 1) == 1);
  absl::SleepFor(absl::Milliseconds(500));  // every WAIT parsed and parked (or refused)
  int closed = 0;
  for (auto& w : waiters) closed += ClosedWithin(*w, absl::Milliseconds(100)) ? 1 : 0;
  const int parked = kWaiters - closed;
  const int64_t held = s.tcp->buffered_bytes();
  INFO("parked " << parked << ", refused " << closed << ", listener holds " << held << " bytes");
  // Each parked WAIT's keys are counted (the old listener counted none: they live in the backend)
  CHECK(held >= parked * key_bytes);
  // ... within the budget: the WAITs that did not fit were refused, their connections closed.
  CHECK(held <= 8 * kMiB + 64 * kKiB);
  CHECK(closed >= 1);
  CHECK(parked >= 5);
  CHECK(Add(small, "/counter", 1) == 2);

  waiters.clear();  // the clients leave: their WAITs are cancelled and the bytes freed
  CHECK(Eventually([&] { return s.tcp->buffered_bytes() == 0; }, absl::Seconds(5)));
}

TEST_CASE("a WAIT over max_wait_bytes is refused and a small one parks") {
  Served s = Serve();  // max_wait_bytes 1 MiB, max_buffered_bytes 256 MiB
  Wire big(s.tcp->port());
  REQUIRE(big.connected());
  AppendWait(big, "huge", 520);  // 2 MB of keys
  REQUIRE(big.Send());
  CHECK(ClosedWithin(big, absl::Seconds(5)));
  CHECK(Eventually([&] { return s.tcp->buffered_bytes() < 64 * kKiB; }, absl::Seconds(2)));

  Wire ok(s.tcp->port());
  REQUIRE(ok.connected());
  REQUIRE(ok.U8(kWait).U64(1).Str("/later").Send());
  CHECK_FALSE(ClosedWithin(ok, absl::Milliseconds(300)));  // parked
  Wire setter(s.tcp->port());
  REQUIRE(setter.U8(kSet).Str("/later").Str("v").Send());
  CHECK(ok.ReadU8() == 0);  // STOP_WAITING
}

TEST_CASE("silent sockets give way to clients: evicted from a full table, timed out under pressure") {
  TcpStoreOptions o;
  o.max_connections = 8;
  o.idle_timeout = absl::Seconds(1);
  Served s = Serve(o);
  std::vector<std::unique_ptr<Wire>> silent;
  for (int i = 0; i < 8; ++i) {
    silent.push_back(std::make_unique<Wire>(s.tcp->port()));
    REQUIRE(silent.back()->connected());
  }
  absl::SleepFor(absl::Milliseconds(100));  // all accepted: the table is full
  // A real client still gets in (the old listener closed it at once: table full)...
  Wire client(s.tcp->port());
  REQUIRE(client.connected());
  CHECK(Add(client, "/c", 5) == 5);
  // ... in place of the oldest silent socket.
  CHECK(ClosedWithin(*silent[0], absl::Seconds(1)));
  // The table is still at least half full of silent sockets: they are closed after idle_timeout;
  // the client, silent between its queries, is not.
  for (size_t i = 1; i < silent.size(); ++i) {
    INFO("silent socket " << i);
    CHECK(ClosedWithin(*silent[i], absl::Seconds(4)));
  }
  absl::SleepFor(absl::Milliseconds(1500));
  CHECK(Add(client, "/c", 1) == 6);
}

TEST_CASE("a half-sent query times out after idle_timeout; a quiet client between queries stays") {
  TcpStoreOptions o;
  o.idle_timeout = absl::Seconds(1);
  Served s = Serve(o);
  Wire client(s.tcp->port());
  REQUIRE(client.connected());
  CHECK(Add(client, "/q", 1) == 1);
  Wire slow(s.tcp->port());
  REQUIRE(slow.connected());
  REQUIRE(slow.U8(kSet).U64(2).Raw("/k", 2).U64(100).Raw("abc", 3).Send());  // 97 bytes owed
  const absl::Time t0 = absl::Now();
  CHECK(ClosedWithin(slow, absl::Seconds(5)));
  CHECK(absl::Now() - t0 >= absl::Milliseconds(900));
  CHECK(Add(client, "/q", 1) == 2);  // idle for as long, between queries: still served
}

// Collects log lines (the payload only).
class LineSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> Lines() {
    std::lock_guard<std::mutex> l(mutex_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& m) override {
    lines_.emplace_back(m.payload.data(), m.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

TEST_CASE("a flood of malformed connections logs one warning a second, with the count of the rest") {
  auto sink = std::make_shared<LineSink>();
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  {
    Served s = Serve();
    constexpr int kFlood = 40;
    for (int i = 0; i < kFlood; ++i) {
      Wire w(s.tcp->port());
      REQUIRE(w.connected());
      REQUIRE(w.U8(0xEE).U64(0).Send());  // no such query type
      CHECK(ClosedWithin(w, absl::Seconds(5)));
    }
    auto closed_lines = [&] {
      int n = 0;
      for (const std::string& l : sink->Lines()) n += absl::StrContains(l, "connection closed");
      return n;
    };
    const int during = closed_lines();
    INFO("warnings logged during the flood: " << during);
    CHECK(during >= 1);
    CHECK(during <= 3);  // (the flood may span a second boundary or two)
    // The rest are counted, and said once the second has passed.
    CHECK(Eventually(
        [&] {
          for (const std::string& l : sink->Lines()) {
            if (absl::StrContains(l, "not logged")) return true;
          }
          return false;
        },
        absl::Seconds(3)));
  }
  spdlog::set_default_logger(previous);
}

}  // namespace
}  // namespace ember::store
