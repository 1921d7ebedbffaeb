// ember-store's TCPStore port against the TCPStore client of Debian's python3-torch (1.13):
// tcpstore_client.py runs the ops and a 4-process init_process_group(gloo) through it, on the
// in-memory backend and on the etcd backend; Ember and torch clients see each other's keys.
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/store/client.h"
#include "runtime/store/etcd_backend.h"
#include "runtime/store/etcd_test_util.h"
#include "runtime/store/server.h"
#include "runtime/store/tcpstore_server.h"

namespace ember::store {
namespace {

void RunTorchClient(StoreServerOptions opts) {
  REQUIRE(std::system("/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null") == 0);
  auto server = StoreServer::Start(std::move(opts));
  REQUIRE(server.ok());
  auto tcp = TcpStoreServer::Start("127.0.0.1", 0, (*server)->backend());
  REQUIRE(tcp.ok());
  auto c = Client::Connect(ClientOptions{.address = (*server)->address()});
  REQUIRE(c.ok());
  REQUIRE(c->Set("from_ember", "ember").ok());
  const char* srcdir = std::getenv("TEST_SRCDIR");
  REQUIRE(srcdir != nullptr);
  const std::string cmd =
      absl::StrCat("timeout 120 /usr/bin/python3 ", srcdir, "/ember/runtime/store/tcpstore_client.py ",
                   (*tcp)->port());
  REQUIRE(std::system(cmd.c_str()) == 0);
  REQUIRE(*c->Get("from_torch") == "torch");
  REQUIRE(*c->Get("cs") == "second");
  REQUIRE(absl::IsNotFound(c->Get("a").status()));
}

TEST_CASE("torch's TCPStore client on the in-memory backend") { RunTorchClient({}); }

TEST_CASE("torch's TCPStore client on the etcd backend") {
  testing::EtcdTestCluster etcd(1);
  EtcdOptions e;
  e.endpoints = etcd.endpoints();
  StoreServerOptions opts;
  opts.make_backend = [e](const BackendOptions& b, base::Clock*) { return NewEtcdBackend(e, b); };
  RunTorchClient(std::move(opts));
}

}  // namespace
}  // namespace ember::store
