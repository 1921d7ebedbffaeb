// Multi-process tests of the comm layer: 2, 3 and 4 ranks, shared memory (direct collectives and
// the shm ring) and TCP-only, every op x dtype x reduce op against a serial reference (in
// comm_worker), bf16/f16 rounding against a float64 reference, subgroups, tagged p2p, mismatched
// sizes, a killed rank, and an injected hang analysed from the flight-recorder dumps.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/comm/env_knobs.h"
#include "runtime/flight/analyze.h"
#include "testing/hang_checks.h"
#include "testing/comm_launcher.h"

namespace ember::comm::testing {
namespace {

const std::string kTcpOnly = absl::StrCat(kEnvDisableShm, "=1");

void Expect(const std::string& scenario, int n, bool tcp_only, double timeout_s,
            std::vector<std::string> args = {}, std::vector<std::string> env = {}) {
  INFO(scenario << " with " << n << " ranks" << (tcp_only ? " (TCP only)" : " (shm)"));
  if (tcp_only) env.push_back(kTcpOnly);
  args.push_back("--scenario=" + scenario);
  args.push_back("--rdzv_dir=" + TempDir("rdzv"));
  RunResult r = RunRanks(n, args, env, timeout_s);
  REQUIRE(!r.timed_out);
  REQUIRE(AllExitZero(r));
}

}  // namespace

TEST_CASE("every op x dtype x reduce op matches the serial reference") {
  for (int n : {2, 3, 4}) {
    Expect("correctness", n, false, 90);
    Expect("correctness", n, true, 90);
  }
}

TEST_CASE("the shm ring path (direct collectives off) still matches the serial reference") {
  Expect("correctness", 3, false, 90, {}, {absl::StrCat(kEnvShmDirect, "=0")});
}

TEST_CASE("bf16/f16 sums: shm rounds once, TCP rings stay within the stated bound") {
  for (int n : {2, 3, 4}) {
    Expect("numerics", n, false, 60, {"--expect_direct"});
    Expect("numerics", n, true, 60);
  }
}

TEST_CASE("64 MiB all_reduce and broadcast stream correctly") {
  Expect("big", 2, false, 90);
  Expect("big", 3, true, 90);
}

TEST_CASE("subgroups: new_group and split") {
  for (int n : {3, 4}) Expect("subgroups", n, false, 60);
  Expect("subgroups", 4, true, 60);
}

TEST_CASE("tagged p2p keeps order per tag, overlaps collectives, rejects size mismatch") {
  for (int n : {2, 3}) Expect("p2p", n, false, 60);
  Expect("p2p", 4, true, 60);
}

TEST_CASE("mismatched sizes across ranks give a clear error, not corruption") {
  Expect("mismatch", 4, false, 60);
  Expect("mismatch", 3, true, 60);
}

TEST_CASE("a killed rank makes the others fail fast") {
  for (bool tcp : {false, true}) {
    RunResult r = RunRanks(3, {"--scenario=kill", "--rdzv_dir=" + TempDir("rdzv")},
                           tcp ? std::vector<std::string>{kTcpOnly} : std::vector<std::string>{},
                           60);
    REQUIRE(!r.timed_out);
    REQUIRE(WIFSIGNALED(r.status[2]));
    for (int i = 0; i < 2; ++i) {
      REQUIRE(WIFEXITED(r.status[i]));
      REQUIRE(WEXITSTATUS(r.status[i]) == 0);
    }
  }
}

TEST_CASE("an injected hang dumps every rank within timeout + 5 s and the analyzer names it") {
  std::string dump = TempDir("fr");
  DumpWatcher watcher(dump, 4);
  RunResult r = RunRanks(4, {"--scenario=hang", "--rdzv_dir=" + TempDir("rdzv"), "--dump_dir=" + dump},
                         {}, 60);
  watcher.Stop();
  const double all_dumped_s = watcher.seconds();
  REQUIRE(!r.timed_out);
  REQUIRE(AllExitZero(r));
  // Bootstrap + 2 warm-up ops take well under 2 s; the op timeout is 3 s.
  INFO("all dumps after " << all_dumped_s << " s");
  REQUIRE(all_dumped_s > 0);
  REQUIRE(all_dumped_s < 2 + 3 + 5);
  RequireRank1NeverJoinedAllReduce(dump);
  // Each dump reports the group's communicator memory: 4 ranks on one host each map an shm
  // segment (its rings and direct-collective stages).
  int dumps = 0;
  for (const auto& f : std::filesystem::directory_iterator(dump)) {
    std::ifstream in(f.path());
    std::stringstream ss;
    ss << in.rdbuf();
    std::smatch m;
    const std::string text = ss.str();
    INFO(f.path().string());
    REQUIRE(std::regex_search(text, m, std::regex("\"memory_bytes\": ([0-9]+)")));
    CHECK(std::stoll(m[1]) > 0);
    ++dumps;
  }
  CHECK(dumps == 4);
}

}  // namespace ember::comm::testing
