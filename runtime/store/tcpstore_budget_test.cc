// TcpStoreServer's listener-wide budget (TcpStoreOptions::max_buffered_bytes): 16 connections each
// send all but the last byte of a 32 MiB value against a 64 MiB budget. The listener's own count
// and the process's RSS stay within the budget + one value + slack, a small client is served
// meanwhile, three large GETs that nobody reads hold one reply at a time and then all arrive, and
// once the senders finish every value is stored as sent. The control: the same senders without
// a budget make the process hold all they sent (what this test would see on the old listener).
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/store/tcpstore_server.h"
#include "runtime/store/tcpstore_test_wire.h"

namespace ember::store {
namespace {

using testing::Serve;
using testing::Served;
using testing::Wire;

constexpr size_t kValue = size_t{32} << 20;
constexpr int kSenders = 16;
constexpr int64_t kMiB = int64_t{1} << 20;

// Resident bytes of this process, after handing freed heap memory back (so that memory freed by
// an earlier test does not hide a new allocation).
int64_t RssBytes() {
  malloc_trim(0);
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

int Dial(int port, int rcvbuf = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

bool SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Reads exactly n bytes within `within`.
bool RecvAll(int fd, char* p, size_t n, absl::Duration within) {
  const absl::Time end = absl::Now() + within;
  while (n > 0 && absl::Now() < end) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, 100) <= 0) continue;
    const ssize_t k = recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return n == 0;
}

// The value sender i sets: its index in the first 8 bytes, then the shared payload.
std::string Marker(int i) { return absl::StrCat(10000000 + i); }

// kSenders connections, each on its own thread: a 1.13 SET of "/big<i>" whose value is kValue
// bytes, all sent but the last byte until Finish(); then the last byte and an ADD whose answer
// (ordered after the SET on the connection) says the SET ran.
class BigSenders {
 public:
  BigSenders(int port, const std::string& payload) {
    for (int i = 0; i < kSenders; ++i) fds_.push_back(Dial(port));
    for (int i = 0; i < kSenders; ++i) {
      threads_.emplace_back([this, i, &payload] {
        const int fd = fds_[i];
        std::string q(1, '\0');  // 1.13 SET
        const std::string key = absl::StrCat("/big", i);
        const uint64_t klen = key.size(), vlen = kValue;
        q.append(reinterpret_cast<const char*>(&klen), 8).append(key);
        q.append(reinterpret_cast<const char*>(&vlen), 8).append(Marker(i));  // 8 bytes
        if (!SendAll(fd, q.data(), q.size()) || !SendAll(fd, payload.data(), kValue - 8 - 1)) {
          return;
        }
        ++waiting_;
        finish_.WaitForNotification();
        std::string rest(1, payload[kValue - 8 - 1]);
        rest.push_back('\x03');  // 1.13 ADD "/done" 1
        const uint64_t dlen = 5, one = 1;
        rest.append(reinterpret_cast<const char*>(&dlen), 8).append("/done");
        rest.append(reinterpret_cast<const char*>(&one), 8);
        int64_t v = 0;
        if (SendAll(fd, rest.data(), rest.size()) &&
            RecvAll(fd, reinterpret_cast<char*>(&v), 8, absl::Seconds(60))) {
          ++stored_;
        }
      });
    }
  }
  ~BigSenders() {
    if (!finish_.HasBeenNotified()) finish_.Notify();
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);  // (a failed test: unblocks the senders)
    for (auto& t : threads_) t.join();
    for (int fd : fds_) close(fd);
  }
  // Senders that sent all but the last byte.
  int waiting() const { return waiting_; }
  // Sends the last bytes; true once every SET was answered.
  bool Finish() {
    finish_.Notify();
    for (auto& t : threads_) t.join();
    threads_.clear();
    return stored_ == kSenders;
  }

 private:
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
  absl::Notification finish_;
  std::atomic<int> stored_{0}, waiting_{0};
};

// Waits until `ready()` and the listener's count then stays the same for 500 ms (at most 60 s);
// returns it.
template <typename Ready>
int64_t Settle(TcpStoreServer* tcp, Ready ready) {
  int64_t last = -1;
  absl::Time since = absl::Now();
  const absl::Time end = absl::Now() + absl::Seconds(60);
  while (absl::Now() < end) {
    const int64_t now = tcp->buffered_bytes();
    if (now != last || !ready()) {
      last = now;
      since = absl::Now();
    } else if (absl::Now() - since > absl::Milliseconds(500)) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return last;
}

StoreServerOptions LargeValues() {
  StoreServerOptions o;
  o.backend.max_value_bytes = kValue;  // (the largest answer must carry one value and its key)
  o.backend.max_response_bytes = 2 * kValue;
  return o;
}

TEST_CASE("max_buffered_bytes bounds what 16 partial 32 MiB values hold; others are served") {
  constexpr int64_t kBudget = 64 * kMiB;
  const std::string payload(kValue, 'p');
  Served s = Serve({.max_buffered_bytes = static_cast<size_t>(kBudget)}, LargeValues());
  auto small_owner = std::make_unique<Wire>(s.tcp->port());
  Wire& small = *small_owner;
  const std::string mid(12 << 20, 'm');  // a 12 MiB value for the large GETs below
  REQUIRE(small.U8(0).Str("/mid").Str(mid).U8(3).Str("/n").U64(1).Send());  // SET, ADD
  REQUIRE(small.ReadI64() == 1);
  const int64_t rss_before = RssBytes();

  auto senders = std::make_unique<BigSenders>(s.tcp->port(), payload);
  // Filled, and the read turn's holder (the one sender that is read) has all but the last byte.
  const int64_t held = Settle(s.tcp.get(), [&] { return senders->waiting() >= 1; });
  const int64_t rss_growth = RssBytes() - rss_before;
  INFO("with a 64 MiB budget: the listener holds " << held / kMiB << " MiB, RSS grew "
       << rss_growth / kMiB << " MiB, of 16 x 32 MiB sent");
  WARN("budget 64 MiB: held " << held / kMiB << " MiB, RSS growth " << rss_growth / kMiB
       << " MiB");
  CHECK(senders->waiting() == 1);  // only the read turn's holder got all but its last byte in
  CHECK(held >= kBudget);          // the senders filled it
  CHECK(held <= kBudget + int64_t{kValue} + 16 * kMiB);  // + the read turn's value + slack
  CHECK(rss_growth < kBudget + int64_t{kValue} + 48 * kMiB);

  // A small client is served while the budget is full.
  absl::Duration worst;
  for (int i = 0; i < 20; ++i) {
    const absl::Time t0 = absl::Now();
    REQUIRE(small.U8(3).Str("/n").U64(1).Send());  // ADD
    REQUIRE(small.ReadI64() == i + 2);
    REQUIRE(small.U8(0).Str("/s").Str(std::string(1000, 'a' + i % 26)).Send());  // SET
    REQUIRE(small.U8(2).Str("/s").Send());  // GET
    REQUIRE(small.ReadStr() == std::string(1000, 'a' + i % 26));
    worst = std::max(worst, absl::Now() - t0);
  }
  WARN("small client's worst round trip (ADD, SET, GET) with the budget full: "
       << absl::FormatDuration(worst));
  CHECK(worst < absl::Seconds(1));

  // Three 12 MiB GETs whose clients read nothing: one answer at a time is held (the reply turn),
  // the others run again once it left; each client gets the whole value.
  const int64_t before_gets = s.tcp->buffered_bytes();
  std::vector<int> readers;
  for (int i = 0; i < 3; ++i) {
    readers.push_back(Dial(s.tcp->port(), 4096));
    std::string q(1, '\x02');  // 1.13 GET
    const uint64_t n = 4;
    q.append(reinterpret_cast<const char*>(&n), 8).append("/mid");
    REQUIRE(SendAll(readers.back(), q.data(), q.size()));
  }
  absl::SleepFor(absl::Milliseconds(500));
  const int64_t with_replies = s.tcp->buffered_bytes() - before_gets;
  INFO("three unread 12 MiB answers add " << with_replies / kMiB << " MiB");
  WARN("three unread 12 MiB answers add " << with_replies / kMiB << " MiB to the count");
  CHECK(with_replies < 16 * kMiB);  // one answer (at most 12 MiB unsent), not three
  std::atomic<int> whole{0};
  std::vector<std::thread> drain;
  for (int fd : readers) {
    const int big = 4 << 20;  // reads faster now (the window opens as the buffer grows)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    drain.emplace_back([fd, &mid, &whole] {
      std::string got(mid.size() + 8, '\0');
      if (RecvAll(fd, got.data(), got.size(), absl::Seconds(30)) && got.substr(8) == mid) ++whole;
    });
  }
  for (auto& t : drain) t.join();
  for (int fd : readers) close(fd);
  CHECK(whole == 3);

  // The senders finish: every value is stored as sent.
  REQUIRE(senders->Finish());
  for (int i = 0; i < kSenders; ++i) {  // read back through TCPStore (1.13 GET)
    std::string q(1, '\x02');
    const std::string key = absl::StrCat("/big", i);
    const uint64_t klen = key.size();
    q.append(reinterpret_cast<const char*>(&klen), 8).append(key);
    REQUIRE(SendAll(small.fd(), q.data(), q.size()));
    std::string got(kValue + 8, '\0');
    REQUIRE(RecvAll(small.fd(), got.data(), got.size(), absl::Seconds(30)));
    uint64_t n = 0;
    std::memcpy(&n, got.data(), 8);
    REQUIRE(n == kValue);
    CHECK(got.compare(8, 8, Marker(i)) == 0);
    CHECK(std::memcmp(got.data() + 16, payload.data(), kValue - 8) == 0);
  }
  auto c = Client::Connect(ClientOptions{.address = s.store->address()});  // and through Ember
  REQUIRE(c.ok());
  absl::StatusOr<std::string> v = c->Get("big3");
  REQUIRE(v.ok());
  CHECK(*v == Marker(3) + payload.substr(0, kValue - 8));
  // Every byte counted was uncounted: with all clients gone the listener holds nothing.
  senders.reset();
  small_owner.reset();
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (s.tcp->buffered_bytes() != 0 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  CHECK(s.tcp->buffered_bytes() == 0);
}

TEST_CASE("the control: without a budget the same senders make the process hold all they sent") {
  const std::string payload(kValue, 'p');
  Served s = Serve({.max_buffered_bytes = 0}, LargeValues());
  const int64_t rss_before = RssBytes();
  BigSenders senders(s.tcp->port(), payload);
  const int64_t held = Settle(s.tcp.get(), [&] { return senders.waiting() == kSenders; });
  const int64_t rss_growth = RssBytes() - rss_before;
  WARN("no budget: held " << held / kMiB << " MiB, RSS growth " << rss_growth / kMiB << " MiB");
  CHECK(held >= kSenders * int64_t{kValue} * 3 / 4);
  CHECK(rss_growth >= kSenders * int64_t{kValue} * 3 / 4);
}

}  // namespace
}  // namespace ember::store
