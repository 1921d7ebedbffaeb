// TcpStoreServer's key_prefix (emberd's per-attempt listeners of script jobs): two listeners on
// one backend are two key spaces. A raw client speaks torch 1.13's wire format (set, get, add,
// num_keys) so the test needs no Python; tcpstore_compat_test covers the real torch client.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/store/tcpstore_server.h"
#include "runtime/store/tcpstore_test_wire.h"

namespace ember::store {
namespace {

// torch 1.13's set, get, add and num_keys over a raw connection (testing::Wire).
class Raw {
 public:
  explicit Raw(int port) : w_(port) {}
  bool ok() const { return w_.connected(); }
  void Set(const std::string& k, const std::string& v) { REQUIRE(w_.U8(0).Str(k).Str(v).Send()); }
  std::string Get(const std::string& k) {
    REQUIRE(w_.U8(2).Str(k).Send());
    return w_.ReadStr();
  }
  int64_t Add(const std::string& k, int64_t d) {
    REQUIRE(w_.U8(3).Str(k).U64(static_cast<uint64_t>(d)).Send());
    return w_.ReadI64();
  }
  int64_t NumKeys() {
    REQUIRE(w_.U8(6).Send());
    return w_.ReadI64();
  }

 private:
  testing::Wire w_;
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
