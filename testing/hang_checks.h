// Shared assertion for the injected-hang tests: the analyzer, reading every rank's dump, must say
// that rank 1 never joined all_reduce seq 3 (the op the comm_worker "hang" scenario skips).
#ifndef EMBER_TESTING_HANG_CHECKS_H_
#define EMBER_TESTING_HANG_CHECKS_H_

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/flight/analyze.h"

namespace ember::comm::testing {

inline void RequireRank1NeverJoinedAllReduce(const std::string& dump_dir) {
  auto rep = fr::AnalyzeDir(dump_dir);
  REQUIRE(rep.ok());
  INFO(rep->ToText());
  REQUIRE(rep->problem);
  REQUIRE(rep->findings[0].kind == "never_joined");
  REQUIRE(rep->findings[0].ranks == std::vector<int>{1});
  REQUIRE(rep->findings[0].op == "all_reduce");
  REQUIRE(rep->findings[0].seq == 3);
}

}  // namespace ember::comm::testing

#endif  // EMBER_TESTING_HANG_CHECKS_H_
