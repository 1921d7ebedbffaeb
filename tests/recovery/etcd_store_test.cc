// emberd over etcd end to end (issue 19): a 3-member etcd cluster (real etcd processes on loopback,
// //runtime/store:etcd_test_util), two emberd processes configured with `store: etcd://...`, so
// each hosts its own store server backed by the same etcd, and a 4-rank job of
// //tests/e2e:test_worker gang-scheduled across both (each rank talks to its own daemon's store).
// kill -9 of the etcd member every store dials first, mid-job: the job SUCCEEDS in its first
// attempt, and its keys are in etcd under the configured prefix (read back with etcdctl).
// Everything is killed on exit: daemons (SIGINT, then SIGKILL), workers (their stop key / store
// loss), etcd members (SIGKILL, and PR_SET_PDEATHSIG).
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "catch2/catch.hpp"
#include "launcher/client.h"
#include "runtime/base/auth.h"
#include "runtime/daemon/process.h"
#include "runtime/store/etcd_test_util.h"
#include "testing/cluster.h"
#include "testing/harness.h"

namespace ember::recovery {
namespace {

namespace v1 = jobs::v1;
namespace fs = std::filesystem;

TEST_CASE("a job over two daemons whose store is a 3-member etcd survives the loss of a member") {
  store::testing::EtcdTestCluster etcd(3);  // destroyed last: after the daemons
  const std::vector<std::string> endpoints = etcd.endpoints();
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string work_root = absl::StrCat(tmp ? tmp : "/tmp", "/etcd-rec-", getpid());
  fs::create_directories(work_root);
  const std::string token = base::GenerateToken();
  const std::string token_file = work_root + "/token";
  REQUIRE(base::WriteTokenFile(token_file, token).ok());
  const std::string prefix = absl::StrCat("/ember-test-", getpid(), "/");

  EmberdProcess::Options o;
  o.emberd = fs::absolute("runtime/daemon/emberd").string();
  o.worker = fs::absolute("tests/e2e/test_worker").string();
  o.store = absl::StrCat("etcd://", absl::StrJoin(endpoints, ","), prefix);
  o.token_file = token_file;
  o.work_root = work_root;
  o.lease_ttl_s = 10;  // a node lease outlives an etcd leader election: no node is lost here
  o.extra_flags = {"--store-listen=127.0.0.1:0", "--etcd-op-timeout-s=20"};
  std::map<std::string, std::unique_ptr<EmberdProcess>> daemons;
  for (const char* node : {"node-a", "node-b"}) {
    o.node = node;
    auto d = EmberdProcess::Start(o, 0);
    REQUIRE(d.ok());
    daemons[node] = std::move(*d);
    // Each daemon hosts its own store server, on etcd.
    INFO(ReadFile(daemons[node]->log()));
    REQUIRE(absl::StrContains(ReadFile(daemons[node]->log()),
                              absl::StrCat("(hosted, etcd [", absl::StrJoin(endpoints, ","),
                                           "] prefix ", prefix, ")")));
  }

  ClientOptions co;
  co.address = daemons["node-a"]->address();
  co.token = token;
  auto cl = Client::Connect(co);
  REQUIRE(cl.ok());
  REQUIRE(WaitFor([&] { auto n = cl->Nodes(); return n.ok() && n->size() == 2; },
                  absl::Seconds(10)));
  // 4 ranks on 2 slots per node: both daemons run ranks. 400 steps of 20 ms: ~8 s of work.
  constexpr int kSteps = 400;
  auto r = cl->Submit(e2e::Spec("etcd-ha", 4, kSteps));
  REQUIRE(r.ok());
  const std::string id = r->job().id();
  REQUIRE(WaitFor([&] {
    auto j = cl->Get(id);
    return j.ok() && j->progress().metrics().step() >= 20;
  }, absl::Seconds(30)));

  etcd.Kill(0);  // the member every daemon's etcd client dials first; 2 of 3 keep the quorum
  auto mid = cl->Get(id);  // answered through the store after the loss
  REQUIRE(mid.ok());
  INFO("step after the kill: " << mid->progress().metrics().step());
  REQUIRE(mid->state() == v1::RUNNING);  // the loss happened mid-job
  REQUIRE(mid->progress().metrics().step() < kSteps);

  auto done = cl->Wait(id, absl::Seconds(60));
  REQUIRE(done.ok());
  INFO(done->reason() << "\nnode-a log:\n" << ReadFile(daemons["node-a"]->log())
       << "\nnode-b log:\n" << ReadFile(daemons["node-b"]->log()));
  REQUIRE(done->state() == v1::SUCCEEDED);
  REQUIRE(done->attempts_size() == 1);                        // no restart
  REQUIRE(done->attempts(0).assignment().nodes_size() == 2);  // ranks on both daemons
  REQUIRE(done->progress().metrics().step() == kSteps);

  // The job's records live in etcd under the prefix (not in a daemon's memory).
  const std::string keys = etcd.Etcdctl(1, absl::StrCat("get --prefix --keys-only '", prefix, "'"));
  INFO(keys);
  REQUIRE(absl::StrContains(keys, prefix));
  REQUIRE(absl::StrContains(keys, id));

  daemons.clear();  // SIGINT: drain
  REQUIRE(WaitFor([&] { return daemon::FindJobProcesses(id).empty(); }, absl::Seconds(10)));
}

}  // namespace
}  // namespace ember::recovery
