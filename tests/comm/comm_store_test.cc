// Multi-process comm tests that rendezvous through the real store: an in-process StoreServer on
// 127.0.0.1:0, and 2 and 4 comm_worker processes that bootstrap with StoreRendezvous over
// ember::store::Client under a job/attempt prefix. Covers a few ops incl. subgroups, and the
// injected hang, whose dump request (the store key <prefix>fr/dump_request) must reach every rank,
// including the rank that never joined the hung op and so can only learn of it from the store.
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/comm/env_knobs.h"
#include "runtime/flight/analyze.h"
#include "runtime/job/keys.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "testing/hang_checks.h"
#include "testing/comm_launcher.h"

namespace ember::comm::testing {
namespace {

std::unique_ptr<store::StoreServer> StartStore() {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  return std::move(*server);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("store rendezvous: ops and subgroups with 2 and 4 ranks") {
  auto server = StartStore();
  int attempt = 0;
  for (int n : {2, 4}) {
    for (bool tcp : {false, true}) {
      if (n == 2 && tcp) continue;  // keep the test short: 2 ranks shm, 4 ranks shm + TCP-only
      INFO(n << " ranks" << (tcp ? " (TCP only)" : " (shm)"));
      // A fresh attempt prefix per run, as the launcher would use after a restart.
      std::string prefix = job::keys::AttemptPrefix("test", attempt++);
      RunResult r = RunRanks(n, {"--scenario=store_ops", "--store=" + server->address(),
                                 "--store_prefix=" + prefix},
                             tcp ? std::vector<std::string>{absl::StrCat(kEnvDisableShm, "=1")}
                                 : std::vector<std::string>{},
                             60);
      REQUIRE(!r.timed_out);
      REQUIRE(AllExitZero(r));
      // The bootstrap keys really went through the store, under the prefix.
      auto c = store::Client::Connect({.address = server->address()});
      REQUIRE(c.ok());
      auto keys = c->NumKeys(prefix);
      REQUIRE(keys.ok());
      REQUIRE(*keys > 0);
    }
  }
}

TEST_CASE("store rendezvous: an injected hang makes every rank dump via the store key") {
  auto server = StartStore();
  const std::string prefix = job::keys::AttemptPrefix("test", 0);
  std::string dump = TempDir("fr-store");
  DumpWatcher watcher(dump, 4);
  RunResult r = RunRanks(4, {"--scenario=hang", "--store=" + server->address(),
                             "--store_prefix=" + prefix, "--dump_dir=" + dump},
                         {}, 60);
  watcher.Stop();
  const double all_dumped_s = watcher.seconds();
  REQUIRE(!r.timed_out);
  REQUIRE(AllExitZero(r));
  INFO("all dumps after " << all_dumped_s << " s");
  REQUIRE(all_dumped_s > 0);
  REQUIRE(all_dumped_s < 2 + 3 + 5);
  // The request key is in the store under the job/attempt prefix...
  auto c = store::Client::Connect({.address = server->address()});
  REQUIRE(c.ok());
  auto req = c->Get(absl::StrCat(prefix, kDumpRequestKey));
  REQUIRE(req.ok());
  INFO("dump_request = " << *req);
  REQUIRE(req->find("group ") == 0);  // "group <name> rank <r> time <ns>", set by a timed-out rank
  // ...and rank 1, which never entered the hung op, dumped because it read that key.
  std::string r1 = ReadFile(dump + "/rank-1.json");
  INFO(r1.substr(0, 400));
  REQUIRE(r1.find("\"reason\": \"request: ") != std::string::npos);
  RequireRank1NeverJoinedAllReduce(dump);
}

}  // namespace ember::comm::testing
