// libFuzzer target: the store's fast-path server (runtime/store/fast_path.h) over a real socket.
// One server (memory backend, a token) lives for the whole run; each input is sent on a fresh
// connection, then the connection is half-closed and answers are read until the server closes or
// 2 s pass. The first input byte chooses the mode: even = the bytes as they are (the handshake is
// fuzzed), odd = a valid handshake frame first (the request frames behind it are fuzzed).
// The server must neither crash (ASan) nor stop accepting: every 64 inputs a fresh connection
// must complete the handshake.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "proto/store.pb.h"
#include "runtime/store/backend.h"
#include "runtime/store/fast_path.h"

namespace {

constexpr char kToken[] = "fuzz-token-0123456789";

struct Server {
  std::unique_ptr<ember::store::Backend> backend;
  std::unique_ptr<ember::store::FastPathServer> fast;
};

Server* Get() {
  static Server* s = [] {
    auto* srv = new Server;
    ember::store::BackendOptions o;
    o.default_wait_timeout = absl::Milliseconds(200);  // a fuzzed blocking Get must not park long
    auto b = ember::store::NewMemoryBackend(o, nullptr);
    if (!b.ok()) std::abort();
    srv->backend = std::move(*b);
    auto f = ember::store::FastPathServer::Start("127.0.0.1", 0, srv->backend.get(), kToken);
    if (!f.ok()) std::abort();
    srv->fast = std::move(*f);
    return srv;
  }();
  return s;
}

std::string Frame(const std::string& payload) {
  std::string out(4, '\0');
  uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + payload;
}

// Sends `bytes`, half-closes, drains answers; returns the bytes received.
std::string Exchange(const std::string& bytes) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(Get()->fast->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Thousands of connections a second: close with RST (linger 0) so that no TIME_WAIT state piles
  // up and the ephemeral ports last. A refused connect is retried for 5 s (the server may be
  // shedding under the flood); still refused after that, the server is gone: a finding.
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) std::abort();
    linger lg{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) break;
    close(fd);
    fd = -1;
    if (attempt == 500) std::abort();
    usleep(10000);
  }
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t w = send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (w <= 0) break;  // the server may close early on a bad frame
    off += static_cast<size_t>(w);
  }
  shutdown(fd, SHUT_WR);
  std::string got;
  char buf[65536];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) break;
    ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) break;
    got.append(buf, static_cast<size_t>(r));
  }
  close(fd);
  return got;
}

std::string Hello() {
  ember::store::v1::RequestBatch hello;
  hello.set_auth_token(kToken);
  return Frame(hello.SerializeAsString());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint64_t n = 0;
  if (size == 0 || size > (1 << 20)) return 0;
  std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  Exchange((data[0] & 1) ? Hello() + rest : rest);
  if (++n % 64 == 0) {
    // Liveness: a well-behaved client still gets its handshake answered.
    std::string ans = Exchange(Hello());
    if (ans.size() < 4) std::abort();
  }
  return 0;
}
