// Test helpers for TcpStoreServer: a raw TCPStore connection (Wire) that writes queries byte by
// byte, and an in-memory store with a TcpStoreServer on a loopback port (Serve). Catch2 REQUIREs
// inside: test code only.
#ifndef EMBER_RUNTIME_STORE_TCPSTORE_TEST_WIRE_H_
#define EMBER_RUNTIME_STORE_TCPSTORE_TEST_WIRE_H_

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "runtime/store/server.h"
#include "runtime/store/tcpstore_server.h"

namespace ember::store::testing {

// A raw TCPStore connection: build a query with the Append* calls, Send() it, read the reply.
class Wire {
 public:
  explicit Wire(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~Wire() { close(fd_); }
  bool connected() const { return connected_; }
  int fd() const { return fd_; }

  Wire& U8(uint8_t v) { return Raw(&v, 1); }
  Wire& U32(uint32_t v) { return Raw(&v, 4); }
  Wire& U64(uint64_t v) { return Raw(&v, 8); }
  Wire& Str(const std::string& s) {
    U64(s.size());
    return Raw(s.data(), s.size());
  }
  Wire& Raw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  bool Send() {
    const bool ok = send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL) ==
                    static_cast<ssize_t>(out_.size());
    out_.clear();
    return ok;
  }
  // Reads exactly n bytes within 5 s; false on EOF, error or timeout.
  bool Read(void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      pollfd pf{fd_, POLLIN, 0};
      if (poll(&pf, 1, 5000) <= 0) return false;
      ssize_t got = recv(fd_, c, n, 0);
      if (got <= 0) return false;
      c += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }
  uint8_t ReadU8() {
    uint8_t v = 0xff;
    REQUIRE(Read(&v, 1));
    return v;
  }
  int64_t ReadI64() {
    int64_t v = -1;
    REQUIRE(Read(&v, 8));
    return v;
  }
  std::string ReadStr() {
    uint64_t n = 0;
    REQUIRE(Read(&n, 8));
    REQUIRE(n < (1 << 20));
    std::string s(n, '\0');
    REQUIRE(Read(s.data(), n));
    return s;
  }
  // The server closed the connection (EOF or reset) within 5 s.
  bool ClosedByPeer() {
    char c;
    pollfd pf{fd_, POLLIN, 0};
    if (poll(&pf, 1, 5000) <= 0) return false;
    return recv(fd_, &c, 1, 0) <= 0;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string out_;
};

struct Served {
  std::unique_ptr<StoreServer> store;
  std::unique_ptr<TcpStoreServer> tcp;
};
inline Served Serve(TcpStoreOptions options = {}, StoreServerOptions store_options = {}) {
  auto store = StoreServer::Start(std::move(store_options));
  REQUIRE(store.ok());
  auto tcp = TcpStoreServer::Start("127.0.0.1", 0, (*store)->backend(), options);
  REQUIRE(tcp.ok());
  return {std::move(*store), std::move(*tcp)};
}

}  // namespace ember::store::testing

#endif  // EMBER_RUNTIME_STORE_TCPSTORE_TEST_WIRE_H_
