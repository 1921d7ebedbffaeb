#include <catch2/catch.hpp>

#include "runtime/base/devices.h"

TEST_CASE("device count never fails; without a GPU it is 0 with a reason") {
  std::string why;
  int n = ember::base::CudaDeviceCount(&why);
  REQUIRE(n >= 0);
  if (n == 0) REQUIRE_FALSE(why.empty());
  if (!ember::base::BuiltWithCuda()) REQUIRE(n == 0);
}
