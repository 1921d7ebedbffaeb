// DialFastPath (client_fast.h) gives up after ClientOptions::dial_timeout, also on the same-host
// abstract Unix socket: a server that stopped accepting (its accept queue full) must not hold a
// dial, such as emberd's lease keeper's once-per-try dial, beyond the bound.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "runtime/store/client.h"
#include "runtime/store/client_fast.h"
#include "runtime/store/fast_path_protocol.h"
#include "runtime/store/store_process_test_util.h"

namespace ember::store {
namespace {

TEST_CASE("a fast-path dial to a Unix socket whose accept queue is full gives up in time") {
  // A loopback TCP port nobody listens on, so the TCP fallback is refused at once.
  const int port = testing::FreePort();

  // The fast path's Unix socket for that port: listening, never accepting, its queue filled.
  sockaddr_un ua;
  const socklen_t ulen = FastPathUnixAddress(port, &ua);
  int lst = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(lst >= 0);
  REQUIRE(bind(lst, reinterpret_cast<sockaddr*>(&ua), ulen) == 0);
  REQUIRE(listen(lst, 0) == 0);
  std::vector<int> pending;
  for (int i = 0; i < 64; ++i) {
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    REQUIRE(c >= 0);
    const int rc = connect(c, reinterpret_cast<sockaddr*>(&ua), ulen);
    const int err = errno;
    if (rc != 0) {
      close(c);
      REQUIRE(err == EAGAIN);  // full: a blocking connect would wait here
      break;
    }
    pending.push_back(c);
  }
  REQUIRE(!pending.empty());

  ClientOptions o;
  o.address = "127.0.0.1:" + std::to_string(port);
  o.use_unix_socket = true;
  o.dial_timeout = absl::Milliseconds(300);
  absl::Notification done;
  absl::StatusOr<int> fd = -1;
  const absl::Time t0 = absl::Now();
  std::thread dial([&] {
    fd = client_internal::DialFastPath(o, port);
    done.Notify();
  });
  const bool in_time = done.WaitForNotificationWithTimeout(absl::Seconds(5));
  const absl::Duration took = absl::Now() - t0;
  if (!in_time) shutdown(lst, SHUT_RDWR), close(lst), lst = -1;  // unblock the stuck dial
  dial.join();
  INFO("the dial took " << absl::FormatDuration(took));
  CHECK(in_time);
  REQUIRE(!fd.ok());
  CHECK(absl::IsUnavailable(fd.status()));
  for (int c : pending) close(c);
  if (lst >= 0) close(lst);
}

}  // namespace
}  // namespace ember::store
