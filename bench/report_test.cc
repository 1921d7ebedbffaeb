#include "bench/report.h"

#include <cmath>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"

ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(bool, allow_missing_peers);

#include <catch2/catch.hpp>

namespace ember::bench {
namespace {

TEST_CASE("a missing peer leaves the target not measured, with its reason") {
  Target t = Target::VsPeer("add_4_clients", 70000, std::nullopt, 2.0, kHigherIsBetter, "ops/s",
                            "tcpstore_peer.py exited 1");
  CHECK_FALSE(t.measured());
  CHECK_FALSE(t.met());
  CHECK_FALSE(t.compared().has_value());
  CHECK(t.Status() == "not measured: tcpstore_peer.py exited 1");
  json::Value j = t.Json();
  CHECK(j.Get("peer").is_null());
  CHECK(j.Get("met").as_bool() == false);
  CHECK(j.Get("reason").as_string() == "tcpstore_peer.py exited 1");
  CHECK(j.Get("compared").is_null());
}

TEST_CASE("a peer figure of zero or NaN counts as missing, never as a ratio") {
  for (double bad : {0.0, -1.0, std::nan("")}) {
    Target t = Target::VsPeer("x", 5, bad, 2.0, kHigherIsBetter, "ops/s", "");
    CHECK_FALSE(t.measured());
    CHECK_FALSE(t.met());
    CHECK_FALSE(t.reason.empty());
  }
}

TEST_CASE("the goal applies to value/peer: higher is better") {
  Target t = Target::VsPeer("get", 90, 40.0, 2.0, kHigherIsBetter, "ops/s", "");
  CHECK(t.measured());
  CHECK(*t.compared() == Approx(2.25));
  CHECK(t.met());
  Target miss = Target::VsPeer("get", 60, 40.0, 2.0, kHigherIsBetter, "ops/s", "");
  CHECK_FALSE(miss.met());
  CHECK(miss.Status() == "missed by 25.0%");  // 1.5x against 2x
  CHECK(miss.Json().Get("reason").is_null());
  // The value alone (90 >= 2) must not count: the ratio decides.
  Target big = Target::VsPeer("get", 90, 100.0, 2.0, kHigherIsBetter, "ops/s", "");
  CHECK_FALSE(big.met());
}

TEST_CASE("the goal applies to value/peer: lower is better") {
  Target t = Target::VsPeer("barrier", 0.2, 0.5, 0.5, kLowerIsBetter, "s", "");
  CHECK(*t.compared() == Approx(0.4));
  CHECK(t.met());
  Target miss = Target::VsPeer("barrier", 0.3, 0.5, 0.5, kLowerIsBetter, "s", "");
  CHECK_FALSE(miss.met());
  CHECK(miss.Status() == "missed by 20.0%");  // 0.6 against 0.5
}

TEST_CASE("an absolute goal applies to the value") {
  CHECK(Target::Absolute("ranks_1024", 0.4, 1.0, kLowerIsBetter, "s").met());
  CHECK_FALSE(Target::Absolute("ranks_1024", 1.5, 1.0, kLowerIsBetter, "s").met());
  CHECK(Target::Absolute("tps", 10, 5, kHigherIsBetter, "t/s").measured());
  CHECK(Target::Absolute("tps", 10, 5, kHigherIsBetter, "t/s").Json().Get("goal_applies_to")
            .as_string() == "value");
}

TEST_CASE("a lower-is-better value of 0 is a failed measurement, never met") {
  Target zero = Target::Absolute("restart_s", 0.0, 1.0, kLowerIsBetter, "s");
  CHECK(zero.failed_measurement());
  CHECK_FALSE(zero.met());
  CHECK(zero.Status().rfind("not measured: ", 0) == 0);
  Target neg = Target::VsPeer("barrier", -0.1, 0.5, 0.5, kLowerIsBetter, "s", "");
  CHECK_FALSE(neg.met());
  // Higher-is-better zero is a plain miss, and a positive lower-is-better value is unaffected.
  CHECK(Target::Absolute("tps", 0.0, 5, kHigherIsBetter, "t/s").Status() == "missed by 100.0%");
  CHECK_FALSE(Target::Absolute("restart_s", 0.5, 1.0, kLowerIsBetter, "s").failed_measurement());
}

TEST_CASE("median and table cells") {
  CHECK(Median({3, 1, 2}) == 2);
  CHECK(Median({4, 1, 3, 2}) == 3);
  CHECK(std::isnan(Median({})));
  Table t("t", {"a", "b", "c"});
  t.AddRow({"x", 3, Cell()});
  json::Value j = t.Json();
  REQUIRE(j.Get("rows").array().size() == 1);
  CHECK(j.Get("rows").array()[0].array()[2].is_null());
  CHECK(t.Text().find(" -") != std::string::npos);
  CHECK(ReadLoadAverage().m1 >= 0);
}

// Last: --json points this process's stdout at stderr.
TEST_CASE("--json exits non-zero on a missing peer unless --allow-missing-peers") {
  absl::SetFlag(&FLAGS_json, true);
  char arg0[] = "report_test";
  char* argv[] = {arg0};
  auto run = [&](bool allow, bool missing) {
    absl::SetFlag(&FLAGS_allow_missing_peers, allow);
    Report r("report_bench", 1, argv);
    r.AddTable("t", {"a"}).AddRow({1});
    r.AddTarget(Target::VsPeer("p", 1, missing ? std::nullopt : std::optional<double>(1.0), 1,
                               kHigherIsBetter, "x", "peer crashed"));
    return r.Finish();
  };
  CHECK(run(false, true) == 3);
  CHECK(run(true, true) == 0);
  CHECK(run(false, false) == 0);
  absl::SetFlag(&FLAGS_json, false);
}

}  // namespace
}  // namespace ember::bench
