#include "runtime/comm/types.h"

#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

namespace ember::comm {

TEST_CASE("half and bfloat16 round-trip and round to nearest even") {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f}) {
    REQUIRE(HalfToFloat(FloatToHalf(f)) == f);
  }
  REQUIRE(std::isinf(HalfToFloat(FloatToHalf(70000.0f))));
  REQUIRE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  REQUIRE(BF16ToFloat(FloatToBF16(1.0f)) == 1.0f);
  REQUIRE(BF16ToFloat(FloatToBF16(1.00390625f)) == 1.0f);  // tie -> even
  // All 65536 halves survive a round trip through float (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(FloatToHalf(f) == h);
  }
}

TEST_CASE("Reduce combines every dtype and op") {
  std::vector<int32_t> a = {1, 5, -3}, b = {4, 2, -7};
  Reduce(a.data(), b.data(), 3, DataType::kI32, ReduceOp::kMax);
  REQUIRE(a == std::vector<int32_t>{4, 5, -3});
  std::vector<uint8_t> u = {200, 3}, v = {100, 4};
  Reduce(u.data(), v.data(), 2, DataType::kU8, ReduceOp::kSum);
  REQUIRE(u == std::vector<uint8_t>{44, 7});
  std::vector<uint16_t> h = {FloatToBF16(1.5f)}, k = {FloatToBF16(2.0f)};
  Reduce(h.data(), k.data(), 1, DataType::kBF16, ReduceOp::kProduct);
  REQUIRE(BF16ToFloat(h[0]) == 3.0f);
  std::vector<double> d = {3.0};
  FinishAvg(d.data(), 1, DataType::kF64, 2);
  REQUIRE(d[0] == 1.5);
  for (DataType t : kAllDataTypes) REQUIRE(ParseDataType(DataTypeName(t)).value() == t);
  REQUIRE(!ParseReduceOp("mean").ok());
}

}  // namespace ember::comm
