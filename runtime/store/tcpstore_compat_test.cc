// ember-store's TCPStore port against real torch TCPStore clients: Debian's python3-torch 1.13
// (/usr/bin/python3, the 1.x wire protocol) and torch 2.15.0 from the peers venv
// (deploy/peers-venv.sh; the 2.x protocol: validation handshake, ping, check, append, multi-get/set,
// cancel-wait). tcpstore_client.py runs the ops and a 4-process init_process_group(gloo) through
// it, on the in-memory backend and on the etcd backend; Ember and torch clients see each other's
// keys. A missing venv fails the 2.15 cases, naming deploy/peers-venv.sh.
#include <cstdlib>
#include <string>

#include "deploy/peers_venv.h"
#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/store/client.h"
#include "runtime/store/etcd_backend.h"
#include "runtime/store/etcd_test_util.h"
#include "runtime/store/server.h"
#include "runtime/store/tcpstore_server.h"

namespace ember::store {
namespace {

// `python`: the interpreter whose torch is the client.
void RunTorchClient(const std::string& python, StoreServerOptions opts) {
  INFO("python: " << python);
  REQUIRE(std::system((python + " -c 'import torch.distributed' 2>/dev/null").c_str()) == 0);
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
      absl::StrCat("timeout 120 ", python, " ", srcdir, "/ember/runtime/store/tcpstore_client.py ",
                   (*tcp)->port());
  REQUIRE(std::system(cmd.c_str()) == 0);
  REQUIRE(*c->Get("from_torch") == "torch");
  REQUIRE(*c->Get("cs") == "second");
  REQUIRE(absl::IsNotFound(c->Get("a").status()));
}

std::string Torch215() {
  INFO(deploy::PeersVenvMissing());
  REQUIRE(deploy::PeersVenvReady());
  return deploy::PeersVenvPython();
}

StoreServerOptions OnEtcd(const testing::EtcdTestCluster& etcd) {
  EtcdOptions e;
  e.endpoints = etcd.endpoints();
  StoreServerOptions opts;
  opts.make_backend = [e](const BackendOptions& b, base::Clock*) { return NewEtcdBackend(e, b); };
  return opts;
}

TEST_CASE("torch 1.13's TCPStore client on the in-memory backend") {
  RunTorchClient(deploy::kDebianPython, {});
}

TEST_CASE("torch 1.13's TCPStore client on the etcd backend") {
  testing::EtcdTestCluster etcd(1);
  RunTorchClient(deploy::kDebianPython, OnEtcd(etcd));
}

TEST_CASE("torch 2.15's TCPStore client on the in-memory backend") { RunTorchClient(Torch215(), {}); }

TEST_CASE("torch 2.15's TCPStore client on the etcd backend") {
  const std::string python = Torch215();
  testing::EtcdTestCluster etcd(1);
  RunTorchClient(python, OnEtcd(etcd));
}

}  // namespace
}  // namespace ember::store
