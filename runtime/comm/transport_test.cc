#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/comm/env_knobs.h"
#include "runtime/comm/shm_ring.h"
#include "runtime/comm/tcp.h"

namespace ember::comm {
namespace {

// Streams `n` bytes a -> b with a producer and a consumer thread, through whatever ring/socket.
void Stream(Channel* tx, Channel* rx, size_t n) {
  std::vector<char> src(n), dst(n, 0);
  std::iota(src.begin(), src.end(), 7);
  std::thread t([&] {
    size_t off = 0;
    while (off < n) off += tx->TrySend(src.data() + off, std::min<size_t>(n - off, 10007)).value();
  });
  size_t off = 0;
  while (off < n) {
    ReadSpan s = rx->Peek(n - off).value();
    std::memcpy(dst.data() + off, s.data, s.size);
    rx->Consume(s.size);
    off += s.size;
  }
  t.join();
  REQUIRE(src == dst);
}

}  // namespace

TEST_CASE("shm ring streams bytes across the wrap point") {
  std::string name = "/ember-test-" + std::to_string(getpid());
  auto a = ShmSegment::Create(name, 2, 4096);
  REQUIRE(a.ok());
  auto b = ShmSegment::Open(name, 2, 4096);
  REQUIRE(b.ok());
  (*a)->Unlink();
  // Ring 0: a -> b, ring 1: b -> a.
  auto ca = MakeShmChannel((*b)->header(0), (*b)->data(0), (*a)->header(1), (*a)->data(1), 4096, -1);
  auto cb = MakeShmChannel((*a)->header(1), (*a)->data(1), (*b)->header(0), (*b)->data(0), 4096, -1);
  Stream(ca.get(), cb.get(), 1 << 20);
  ca->Shutdown();
  REQUIRE(absl::IsUnavailable(cb->Peek(10).status()));
}

TEST_CASE("shm doorbells wake a sleeping consumer and producer; Shutdown wakes the waiter") {
  std::string name = "/ember-test-bell-" + std::to_string(getpid());
  auto a = ShmSegment::Create(name, 2, 4096);
  REQUIRE(a.ok());
  auto b = ShmSegment::Open(name, 2, 4096);
  REQUIRE(b.ok());
  (*a)->Unlink();
  // a sends to b over ring 0 of b's segment; b's doorbell 0 is in b's segment, a's in a's.
  auto tx = MakeShmChannel((*b)->header(0), (*b)->data(0), (*a)->header(1), (*a)->data(1), 4096,
                           -1, (*b)->doorbell(0), (*a)->doorbell(0));
  auto rx = MakeShmChannel((*a)->header(1), (*a)->data(1), (*b)->header(0), (*b)->data(0), 4096,
                           -1, (*a)->doorbell(0), (*b)->doorbell(0));
  const size_t n = 1 << 20;
  std::vector<char> src(n), dst(n, 0);
  std::iota(src.begin(), src.end(), 3);
  // Both sides only ever sleep (no spinning): every wake must come from the other side's ring.
  std::thread t([&] {
    Doorbell* mine = (*a)->doorbell(0);
    size_t off = 0;
    while (off < n) {
      size_t k = tx->TrySend(src.data() + off, std::min<size_t>(n - off, 3001)).value();
      if (k > 0) {
        off += k;
        continue;
      }
      uint32_t seen = ArmDoorbell(mine);
      k = tx->TrySend(src.data() + off, std::min<size_t>(n - off, 3001)).value();
      if (k == 0) WaitDoorbell(mine, seen, 10000000);  // 10 s: a lost wake would time the test out
      DisarmDoorbell(mine);
      off += k;
    }
  });
  Doorbell* mine = (*b)->doorbell(0);
  size_t off = 0;
  while (off < n) {
    size_t k = rx->TryRecv(dst.data() + off, n - off).value();
    if (k == 0) {
      uint32_t seen = ArmDoorbell(mine);
      k = rx->TryRecv(dst.data() + off, n - off).value();
      if (k == 0) WaitDoorbell(mine, seen, 10000000);
      DisarmDoorbell(mine);
    }
    off += k;
  }
  t.join();
  REQUIRE(src == dst);
  // A waiter on b's doorbell is woken by Shutdown on either side.
  std::thread w([&] {
    uint32_t seen = ArmDoorbell(mine);
    while (rx->Peek(1).ok()) {
      WaitDoorbell(mine, seen, 10000000);
      seen = (*b)->doorbell(0)->seq.load();
    }
    DisarmDoorbell(mine);
  });
  usleep(20000);
  tx->Shutdown();
  w.join();
  REQUIRE(absl::IsUnavailable(rx->Peek(1).status()));
}

TEST_CASE("tcp channel streams bytes and reports a closed peer") {
  auto l = TcpListener::Listen("127.0.0.1");
  REQUIRE(l.ok());
  auto c = TcpConnect("127.0.0.1", (*l)->port(), absl::Seconds(5));
  REQUIRE(c.ok());
  auto s = (*l)->Accept(absl::Seconds(5));
  REQUIRE(s.ok());
  auto tx = MakeTcpChannel(*c), rx = MakeTcpChannel(*s);
  Stream(tx.get(), rx.get(), 8 << 20);
  tx.reset();
  absl::Status st;
  for (int i = 0; i < 1000 && st.ok(); ++i) {
    st = rx->Peek(1).status();
    usleep(1000);
  }
  REQUIRE(absl::IsUnavailable(st));
}

TEST_CASE("tcp sockets use CUBIC unless EMBER_COMM_TCP_CONGESTION says otherwise") {
  auto sysctl = [](const std::string& name) {
    std::ifstream f("/proc/sys/net/ipv4/" + name);
    std::string v;
    std::getline(f, v);
    return " " + v + " ";
  };
  const std::string available = sysctl("tcp_available_congestion_control");
  const std::string allowed = sysctl("tcp_allowed_congestion_control");
  std::string dflt = sysctl("tcp_congestion_control");
  dflt = dflt.substr(1, dflt.size() - 2);
  auto l = TcpListener::Listen("127.0.0.1");
  REQUIRE(l.ok());
  auto congestion = [&] {
    auto c = TcpConnect("127.0.0.1", (*l)->port(), absl::Seconds(5));
    REQUIRE(c.ok());
    auto s = (*l)->Accept(absl::Seconds(5));
    REQUIRE(s.ok());
    char name[32] = {};
    socklen_t len = sizeof(name);
    REQUIRE(getsockopt(*s, IPPROTO_TCP, TCP_CONGESTION, name, &len) == 0);
    close(*c);
    close(*s);
    return std::string(name);
  };
  const bool cubic_ok = available.find(" cubic ") != std::string::npos &&
                        (geteuid() == 0 || allowed.find(" cubic ") != std::string::npos);
  INFO("available:" << available << " allowed:" << allowed << " default: " << dflt);
  REQUIRE(congestion() == (cubic_ok ? "cubic" : dflt));
  setenv(kEnvTcpCongestion, "system", 1);
  REQUIRE(congestion() == dflt);
  setenv(kEnvTcpCongestion, "reno", 1);  // built in, always allowed
  REQUIRE(congestion() == "reno");
  unsetenv(kEnvTcpCongestion);
}

}  // namespace ember::comm
