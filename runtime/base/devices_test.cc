#include <cstdlib>

#include <catch2/catch.hpp>

#include "runtime/base/devices.h"

TEST_CASE("device count never fails; without a GPU it is 0 with a reason") {
  std::string why;
  int n = ember::base::CudaDeviceCount(&why);
  REQUIRE(n >= 0);
  if (n == 0) REQUIRE_FALSE(why.empty());
  if (!ember::base::BuiltWithCuda()) REQUIRE(n == 0);
  // On a GPU machine (tests/gpu/run.sh) the expected count is given: detection must find them.
  if (const char* want = std::getenv("EMBER_EXPECT_GPUS")) {
    INFO("cuda says: " << why);
    REQUIRE(ember::base::BuiltWithCuda());
    REQUIRE(n >= std::atoi(want));
  }
}
