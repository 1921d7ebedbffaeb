#include <sys/socket.h>
#include <unistd.h>

#include <numeric>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

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

}  // namespace ember::comm
