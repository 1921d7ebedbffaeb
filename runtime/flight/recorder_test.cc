#include "runtime/flight/recorder.h"

#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

namespace ember::flight {

TEST_CASE("ring keeps the newest entries and tracks seq numbers") {
  FlightRecorder fr({.capacity = 4});
  int g = fr.RegisterGroup({.name = "world", .rank = 1, .size = 2});
  uint64_t last = 0;
  for (int i = 1; i <= 10; ++i) {
    last = fr.Record({.group_id = g, .collective_seq = i, .op = "all_reduce", .in_numel = i,
                      .in_dtype = "f32", .out_dtype = "f32", .tag = "t"});
    fr.Start(last);
    if (i < 10) fr.Complete(last);
  }
  auto e = fr.Entries();
  REQUIRE(e.size() == 4);
  REQUIRE(e.front().collective_seq == 7);
  REQUIRE(e.back().state == State::kStarted);
  auto groups = fr.Groups();
  REQUIRE(groups[0].last_enqueued_seq == 10);
  REQUIRE(groups[0].last_completed_seq == 9);
  fr.Fail(last, "boom \"quoted\"");
  std::string json = fr.DumpJson("api", 1);
  REQUIRE(json.find("\"schema\": \"ember.flight_recorder\"") != std::string::npos);
  REQUIRE(json.find("\"state\": \"failed\"") != std::string::npos);
  REQUIRE(json.find("boom \\\"quoted\\\"") != std::string::npos);
  REQUIRE(json.find("\"memory_bytes\": 0}") != std::string::npos);
  fr.SetGroupMemory(g, 3 << 20);
  fr.SetGroupMemory(7, 1);  // no such group: ignored
  REQUIRE(fr.Groups()[0].memory_bytes == 3 << 20);
  REQUIRE(fr.DumpJson("api", 1).find("\"memory_bytes\": 3145728}") != std::string::npos);
  fr.Start(1);  // overwritten entry: ignored
  REQUIRE(fr.ClaimDump("x"));
  REQUIRE(!fr.ClaimDump("x"));
}

TEST_CASE("DumpToFile writes the document atomically") {
  FlightRecorder fr;
  std::string path = "/tmp/ember-fr-test-" + std::to_string(getpid()) + "/sub/rank-0.json";
  REQUIRE(fr.DumpToFile(path, "api", 0).ok());
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  REQUIRE(ss.str().find("\"version\": \"1.1\"") != std::string::npos);
}

}  // namespace ember::flight
