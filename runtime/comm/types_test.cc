#include "runtime/comm/types.h"

#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

namespace ember::comm {

TEST_CASE("half and bfloat16 round-trip and round to nearest even") {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f}) {
    REQUIRE(base::F16ToF32(base::F32ToF16(f)) == f);
  }
  REQUIRE(std::isinf(base::F16ToF32(base::F32ToF16(70000.0f))));
  REQUIRE(std::isnan(base::F16ToF32(base::F32ToF16(NAN))));
  REQUIRE(base::Bf16ToF32(base::F32ToBf16(1.0f)) == 1.0f);
  REQUIRE(base::Bf16ToF32(base::F32ToBf16(1.00390625f)) == 1.0f);  // tie -> even
  // All 65536 halves survive a round trip through float (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = base::F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(base::F32ToF16(f) == h);
  }
}

TEST_CASE("Reduce combines every dtype and op") {
  std::vector<int32_t> a = {1, 5, -3}, b = {4, 2, -7};
  Reduce(a.data(), b.data(), 3, DataType::kI32, ReduceOp::kMax);
  REQUIRE(a == std::vector<int32_t>{4, 5, -3});
  std::vector<uint8_t> u = {200, 3}, v = {100, 4};
  Reduce(u.data(), v.data(), 2, DataType::kU8, ReduceOp::kSum);
  REQUIRE(u == std::vector<uint8_t>{44, 7});
  std::vector<uint16_t> h = {base::F32ToBf16(1.5f)}, k = {base::F32ToBf16(2.0f)};
  Reduce(h.data(), k.data(), 1, DataType::kBF16, ReduceOp::kProduct);
  REQUIRE(base::Bf16ToF32(h[0]) == 3.0f);
  std::vector<double> d = {3.0};
  FinishAvg(d.data(), 1, DataType::kF64, 2);
  REQUIRE(d[0] == 1.5);
  for (DataType t : kAllDataTypes) {
    REQUIRE(ParseDataType(DTypeName(t)).value() == t);
    REQUIRE(IsReducible(t));
  }
  REQUIRE(!IsReducible(DataType::kU16));
  REQUIRE(!ParseDataType("u16").ok());  // a DType, but not one comm reduces
  REQUIRE(!ParseReduceOp("mean").ok());
}

TEST_CASE("ReduceMany rounds a 16-bit sum once, in f32, in source order") {
  // 1 + 2^-8 + 2^-8: two 2-input hops each round a tie back to 1 (even); one rounding of the
  // exact sum 1 + 2^-7 keeps it (representable in bf16).
  uint16_t a[1] = {base::F32ToBf16(1.0f)}, b[1] = {base::F32ToBf16(0.00390625f)}, c[1] = {b[0]};
  uint16_t pairwise[1] = {a[0]};
  Reduce(pairwise, b, 1, DataType::kBF16, ReduceOp::kSum);
  Reduce(pairwise, c, 1, DataType::kBF16, ReduceOp::kSum);
  REQUIRE(base::Bf16ToF32(pairwise[0]) == 1.0f);
  const void* srcs[] = {a, b, c};
  uint16_t once[1];
  ReduceMany(once, srcs, 3, 1, DataType::kBF16, ReduceOp::kSum);
  REQUIRE(base::Bf16ToF32(once[0]) == 1.0078125f);
  // Average: (1 + 2^-8 + 2^-8) / 3 divided in f32, rounded once; dst may alias a source.
  ReduceMany(a, srcs, 3, 1, DataType::kBF16, ReduceOp::kAvg, 3);
  REQUIRE(a[0] == base::F32ToBf16(1.0078125f / 3));
  // Same for f16 (ulp 2^-10 at 1).
  uint16_t h1[1] = {base::F32ToF16(1.0f)}, h2[1] = {base::F32ToF16(0.00048828125f)}, h3[1];
  const void* hs[] = {h1, h2, h2};
  ReduceMany(h3, hs, 3, 1, DataType::kF16, ReduceOp::kSum);
  REQUIRE(base::F16ToF32(h3[0]) == 1.0009765625f);
  // Wider types: several blocks, every op, integer average truncates; matches pairwise Reduce.
  for (ReduceOp op : kAllReduceOps) {
    std::vector<int32_t> x(5000), y(5000), z(5000);
    for (int i = 0; i < 5000; ++i) {
      x[i] = i % 7 - 3;
      y[i] = i % 5 - 2;
      z[i] = i % 11 - 5;
    }
    std::vector<int32_t> want = x;
    Reduce(want.data(), y.data(), 5000, DataType::kI32, op);
    Reduce(want.data(), z.data(), 5000, DataType::kI32, op);
    if (op == ReduceOp::kAvg) FinishAvg(want.data(), 5000, DataType::kI32, 3);
    const void* is[] = {x.data(), y.data(), z.data()};
    ReduceMany(y.data(), is, 3, 5000, DataType::kI32, op, op == ReduceOp::kAvg ? 3 : 0);
    REQUIRE(y == want);
  }
}

}  // namespace ember::comm
