// Schedule building: layout validation names the numbers, the kinds' compute orders against
// hand-written ones, message placement, and the printed table.
#include "runtime/pipeline/schedule.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace ember::pipeline {
namespace {

std::vector<std::string> Strings(const std::vector<Action>& list, bool compute_only) {
  std::vector<std::string> out;
  for (const Action& a : list)
    if (!compute_only || a.is_compute()) out.push_back(ActionToString(a));
  return out;
}

TEST_CASE("ParseScheduleKind round-trips and names the choices") {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B,
                         ScheduleKind::kZBH1}) {
    auto p = ParseScheduleKind(ScheduleKindName(k));
    REQUIRE(p.ok());
    CHECK(*p == k);
  }
  CHECK(*ParseScheduleKind("1F1B") == ScheduleKind::k1F1B);
  CHECK(*ParseScheduleKind("ZB-H1") == ScheduleKind::kZBH1);
  auto bad = ParseScheduleKind("2f2b");
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("gpipe, 1f1b, interleaved-1f1b or zbh1") != std::string::npos);
}

TEST_CASE("impossible layouts are rejected naming the numbers") {
  struct Case {
    ScheduleOptions o;
    std::string want;
  };
  std::vector<Case> cases = {
      {{ScheduleKind::k1F1B, 4, 4, 3}, "3 micro-batches is fewer than the 4 stages"},
      {{ScheduleKind::kZBH1, 4, 4, 2}, "2 micro-batches is fewer than the 4 stages"},
      {{ScheduleKind::kInterleaved1F1B, 6, 4, 8}, "6 stages do not divide evenly over 4 ranks"},
      {{ScheduleKind::kInterleaved1F1B, 8, 4, 6}, "6 micro-batches is not a multiple of 4 ranks"},
      {{ScheduleKind::kGPipe, 4, 2, 8}, "stages = 4 and ranks = 2"},
      {{ScheduleKind::kGPipe, 0, 0, 8}, "stages (0), ranks (0) and micro-batches (8)"},
  };
  for (const Case& c : cases) {
    auto s = BuildSchedule(c.o);
    INFO(c.want);
    REQUIRE(!s.ok());
    CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.status().message().find(c.want) != std::string::npos);
  }
  // GPipe accepts fewer micro-batches than stages.
  CHECK(BuildSchedule({ScheduleKind::kGPipe, 4, 4, 2}).ok());
}

TEST_CASE("compute orders match the published schedules") {
  // 1F1B, 3 stages, 4 micro-batches: rank r warms up with 2-r forwards.
  auto s = BuildSchedule({ScheduleKind::k1F1B, 3, 3, 4});
  REQUIRE(s.ok());
  CHECK(Strings(s->ranks[0], true) ==
        std::vector<std::string>{"F0.0", "F0.1", "F0.2", "B0.0", "F0.3", "B0.1", "B0.2", "B0.3"});
  CHECK(Strings(s->ranks[2], true) ==
        std::vector<std::string>{"F2.0", "B2.0", "F2.1", "B2.1", "F2.2", "B2.2", "F2.3", "B2.3"});
  // ZB-H1, 3 stages, 3 micro-batches (rank r defers r weight-grads).
  auto z = BuildSchedule({ScheduleKind::kZBH1, 3, 3, 3});
  REQUIRE(z.ok());
  CHECK(Strings(z->ranks[0], true) == std::vector<std::string>{"F0.0", "F0.1", "F0.2", "I0.0",
                                                               "W0.0", "I0.1", "W0.1", "I0.2",
                                                               "W0.2"});
  CHECK(Strings(z->ranks[2], true) == std::vector<std::string>{"F2.0", "I2.0", "F2.1", "I2.1",
                                                               "F2.2", "I2.2", "W2.0", "W2.1",
                                                               "W2.2"});
  // Interleaved, 2 ranks x 2 stages, 2 micro-batches: rank 0 holds stages 0 and 2.
  auto i = BuildSchedule({ScheduleKind::kInterleaved1F1B, 4, 2, 2});
  REQUIRE(i.ok());
  CHECK(Strings(i->ranks[0], true) ==
        std::vector<std::string>{"F0.0", "F0.1", "F2.0", "F2.1", "B2.0", "B2.1", "B0.0", "B0.1"});
}

TEST_CASE("messages: every send has its receive with the same tag, reduce and optimizer placed") {
  auto s = BuildSchedule({ScheduleKind::k1F1B, 2, 2, 2});
  REQUIRE(s.ok());
  const int act0 = MessageTag(0, 0, 2, false), grad0 = MessageTag(0, 0, 2, true);
  CHECK(act0 != grad0);
  CHECK(Strings(s->ranks[0], false) ==
        std::vector<std::string>{"F0.0", "SA0.0>1", "F0.1", "SA0.1>1", "RG0.0<1", "B0.0",
                                 "RG0.1<1", "B0.1", "RED0", "OPT"});
  CHECK(Strings(s->ranks[1], false) ==
        std::vector<std::string>{"RA1.0<0", "F1.0", "RA1.1<0", "B1.0", "SG1.0>0", "F1.1", "B1.1",
                                 "SG1.1>0", "RED1", "OPT"});
  CHECK(s->ranks[0][1].tag == act0);
  CHECK(s->ranks[1][0].tag == act0);
  CHECK(s->ranks[1][4].tag == grad0);
  CHECK(s->ranks[0][4].tag == grad0);
}

TEST_CASE("BuildSchedule is a pure function") {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZBH1}) {
    auto a = BuildSchedule({k, 4, 4, 8});
    auto b = BuildSchedule({k, 4, 4, 8});
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->ranks == b->ranks);
    CHECK(FormatSchedule(*a) == FormatSchedule(*b));
  }
}

TEST_CASE("FormatSchedule prints one column per rank and one row per step") {
  auto s = BuildSchedule({ScheduleKind::k1F1B, 2, 2, 2});
  REQUIRE(s.ok());
  const std::string t = FormatSchedule(*s);
  CHECK(t.find("1f1b: 2 stages on 2 ranks (stage s runs on rank s % 2), 2 micro-batches\n") == 0);
  CHECK(t.find("step  | rank 0  | rank 1\n") != std::string::npos);
  CHECK(t.find("   0  | F0.0    | RA1.0<0\n") != std::string::npos);
  CHECK(t.find("   9  | OPT     | OPT\n") != std::string::npos);
}

}  // namespace
}  // namespace ember::pipeline
