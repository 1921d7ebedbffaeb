// TcpStoreServer's key_prefix (emberd's per-attempt listeners of script jobs): two listeners on
// one backend are two key spaces. A raw client speaks torch 1.13's wire format (set, get, add,
// num_keys) so the test needs no Python; tcpstore_compat_test covers the real torch client.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/store/tcpstore_server.h"

namespace ember::store {
namespace {

class Raw {
 public:
  explicit Raw(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~Raw() { close(fd_); }
  bool ok() const { return ok_; }
  void Set(const std::string& k, const std::string& v) {
    Byte(0);
    Str(k);
    Str(v);
  }
  std::string Get(const std::string& k) {
    Byte(2);
    Str(k);
    uint64_t n = I64();
    std::string s(n, '\0');
    Read(s.data(), n);
    return s;
  }
  int64_t Add(const std::string& k, int64_t d) {
    Byte(3);
    Str(k);
    Send(&d, 8);
    return static_cast<int64_t>(I64());
  }
  int64_t NumKeys() {
    Byte(6);
    return static_cast<int64_t>(I64());
  }

 private:
  void Send(const void* p, size_t n) { REQUIRE(write(fd_, p, n) == static_cast<ssize_t>(n)); }
  void Byte(uint8_t b) { Send(&b, 1); }
  void Str(const std::string& s) {
    uint64_t n = s.size();
    Send(&n, 8);
    Send(s.data(), s.size());
  }
  void Read(void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      ssize_t got = recv(fd_, c, n, 0);
      REQUIRE(got > 0);
      c += got;
      n -= static_cast<size_t>(got);
    }
  }
  uint64_t I64() {
    uint64_t v = 0;
    Read(&v, 8);
    return v;
  }
  int fd_ = -1;
  bool ok_ = false;
};

TEST_CASE("a key prefix makes a listener its own key space; Shutdown closes its port") {
  auto server = StoreServer::Start({});
  REQUIRE(server.ok());
  auto a = TcpStoreServer::Start("127.0.0.1", 0, (*server)->backend(), {.key_prefix = "scope-a/torch/"});
  auto b = TcpStoreServer::Start("127.0.0.1", 0, (*server)->backend(), {.key_prefix = "scope-b/torch/"});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto c = Client::Connect(ClientOptions{.address = (*server)->address()});
  REQUIRE(c.ok());
  REQUIRE(c->Set("outside", "x").ok());
  {
    Raw ra((*a)->port()), rb((*b)->port());
    REQUIRE(ra.ok());
    REQUIRE(rb.ok());
    ra.Set("/k", "from-a");  // TCPStore's "/k" is the user key "k"
    rb.Set("/k", "from-b");
    CHECK(ra.Add("/n", 5) == 5);
    CHECK(rb.Add("/n", 1) == 1);  // not a's counter
    CHECK(ra.Get("/k") == "from-a");
    CHECK(rb.Get("/k") == "from-b");
    CHECK(ra.NumKeys() == 2);  // k and n under a's prefix only, not "outside" or b's
    CHECK(rb.NumKeys() == 2);
  }
  CHECK(*c->Get("scope-a/torch/k") == "from-a");
  CHECK(*c->Get("scope-b/torch/k") == "from-b");
  const int port = (*a)->port();
  (*a)->Shutdown();
  Raw stale(port);  // a rank of the finished attempt: refused
  CHECK_FALSE(stale.ok());
}

}  // namespace
}  // namespace ember::store
