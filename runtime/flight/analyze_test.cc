#include "runtime/flight/analyze.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>

#include "runtime/flight/recorder.h"

namespace ember::fr {
namespace {

// Rank r completes `done` all_reduces, then enqueues (and starts) `extra` more.
std::string Dump(int rank, int done, int extra, int64_t numel_at_3 = 1024) {
  flight::FlightRecorder fr;
  int g = fr.RegisterGroup({.name = "world", .rank = rank, .size = 4, .global_rank = rank,
                            .global_ranks = {0, 1, 2, 3}});
  for (int s = 1; s <= done + extra; ++s) {
    uint64_t id = fr.Record({.group_id = g, .collective_seq = s, .op = "all_reduce",
                             .in_numel = s == 3 ? numel_at_3 : 1024, .in_dtype = "f32",
                             .out_dtype = "f32", .tag = "step"});
    fr.Start(id);
    if (s <= done) fr.Complete(id);
  }
  return fr.DumpJson("test", rank);
}

}  // namespace

TEST_CASE("names the rank that never joined and the op") {
  std::map<std::string, std::string> files = {{"rank-0.json", Dump(0, 2, 1)},
                                              {"rank-1.json", Dump(1, 2, 0)},
                                              {"rank-2.json", Dump(2, 2, 1)},
                                              {"rank-3.json", Dump(3, 2, 1)}};
  auto r = AnalyzeTexts(files);
  REQUIRE(r.ok());
  REQUIRE(r->problem);
  REQUIRE(r->findings[0].kind == "never_joined");
  REQUIRE(r->findings[0].ranks == std::vector<int>{1});
  REQUIRE(r->findings[0].op == "all_reduce");
  REQUIRE(r->findings[0].seq == 3);
  REQUIRE(r->ToText().find("ranks [1] never joined all_reduce (seq 3") != std::string::npos);
  REQUIRE(r->groups[0].last_completed.at(1) == 2);
  REQUIRE(r->ToJson().find("\"kind\": \"never_joined\"") != std::string::npos);
}

TEST_CASE("finds the first disagreement and missing dumps; clean runs pass") {
  auto r = AnalyzeTexts({{"rank-0.json", Dump(0, 2, 2)}, {"rank-1.json", Dump(1, 2, 2, 7)},
                         {"rank-2.json", Dump(2, 2, 2)}});
  REQUIRE(r.ok());
  bool mismatch = false, missing = false;
  for (auto& f : r->findings) {
    if (f.kind == "mismatch") {
      mismatch = true;
      REQUIRE(f.seq == 3);
      REQUIRE(f.ranks == std::vector<int>{1});
    }
    if (f.kind == "missing_dump") missing = f.ranks == std::vector<int>{3};
  }
  REQUIRE(mismatch);
  REQUIRE(missing);
  auto ok = AnalyzeTexts({{"rank-0.json", Dump(0, 5, 0)}, {"rank-1.json", Dump(1, 5, 0)},
                          {"rank-2.json", Dump(2, 5, 0)}, {"rank-3.json", Dump(3, 5, 0)}});
  REQUIRE(ok.ok());
  REQUIRE(!ok->problem);
  REQUIRE(!AnalyzeTexts({{"rank-0.json", "{\"schema\": \"ember.flight_recorder\", \"version\": \"2.0\"}"}}).ok());
  REQUIRE(!AnalyzeTexts({{"rank-0.json", "{bad"}}).ok());
}

}  // namespace ember::fr

namespace ember::fr {

// Issue 12: a FIFO named like a dump made `fr analyze` block forever in open(2); the alarm turns
// such a hang into a failure.
TEST_CASE("a FIFO among the dumps is refused at once") {
  std::string dir = std::string(getenv("TEST_TMPDIR")) + "/fr_fifo";
  mkdir(dir.c_str(), 0700);
  { std::ofstream(dir + "/rank-0.json") << Dump(0, 2, 0); }
  REQUIRE(mkfifo((dir + "/rank-1.json").c_str(), 0600) == 0);
  alarm(20);
  auto r = AnalyzeDir(dir);
  alarm(0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("rank-1.json is a FIFO") != std::string::npos);
}

}  // namespace ember::fr
