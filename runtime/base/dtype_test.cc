// DType names/sizes against the literal spellings files use, and the 16-bit float conversions
// against independent references: values decoded with ldexp from the format's definition, and
// rounding by searching the sorted table of every finite 16-bit value (nearest, ties to even).
#include "runtime/base/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace ember::base {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Value of a 16-bit float with `mbits` mantissa bits and exponent bias `bias` (exponent field all
// ones = inf/NaN), from the definition. Returns NaN for NaNs.
double Decode16(uint16_t h, int mbits, int bias) {
  const int ebits = 15 - mbits;
  const int s = h >> 15, e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1);
  double v;
  if (e == (1 << ebits) - 1) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - mbits);
  } else {
    v = std::ldexp(static_cast<double>((1 << mbits) + m), e - bias - mbits);
  }
  return s ? -v : v;
}
double DecodeHalf(uint16_t h) { return Decode16(h, 10, 15); }
double DecodeBf16(uint16_t h) { return Decode16(h, 7, 127); }

// Round-to-nearest-even by search: the positive finite codes of a 16-bit format are increasing in
// value, so find the two neighbours of |x| and pick the nearer (the even code on a tie). Beyond the
// largest finite value, the next "code" is infinity (IEEE: overflow when the rounded magnitude
// reaches max + ulp/2, which is a tie with the even infinity code).
uint16_t RoundRef(float x, double (*decode)(uint16_t), uint16_t inf_code) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  uint16_t lo = 0, hi = inf_code;  // invariant: decode(lo) <= a < decode(hi)
  if (a >= decode(static_cast<uint16_t>(inf_code - 1))) {
    lo = inf_code - 1;
    const double max = decode(lo), ulp = max - decode(static_cast<uint16_t>(lo - 1));
    if (a == max) return sign | lo;
    const double d_lo = a - max, d_hi = ulp - d_lo;  // distance to max + ulp (the "inf" slot)
    if (d_lo < d_hi) return sign | lo;
    return sign | inf_code;  // above the midpoint or a tie (inf_code is even)
  }
  while (hi - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    (decode(mid) <= a ? lo : hi) = mid;
  }
  const double d_lo = a - decode(lo), d_hi = decode(hi) - a;
  if (d_lo < d_hi) return sign | lo;
  if (d_hi < d_lo) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

bool IsNan16(uint16_t h, int mbits) {
  const int ebits = 15 - mbits;
  return ((h >> mbits) & ((1 << ebits) - 1)) == (1 << ebits) - 1 && (h & ((1 << mbits) - 1));
}

std::vector<float> SpecialFloats() {
  std::vector<float> v = {
      0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 3.14159265f, 1e-3f, 1e30f, -1e-30f,
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest(),
      std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
      // f16 edges: largest finite, just below/at/above the overflow midpoint 65520, subnormals.
      65504.0f, 65519.99f, 65520.0f, 65536.0f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24),
      std::ldexp(1.0f, -25), std::ldexp(1.5f, -25), std::ldexp(1.0f, -26), std::ldexp(3.0f, -25),
      std::ldexp(1023.0f, -24), std::ldexp(1023.5f, -24), std::ldexp(1022.5f, -24),
      // ties at 1: f16 ulp 2^-10, bf16 ulp 2^-7.
      1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11), 1.00390625f, 1.01171875f,
      // bf16 overflow edge: largest finite bf16 and the midpoint to infinity.
      FromBits(0x7f7f0000u), FromBits(0x7f7f7fffu), FromBits(0x7f7f8000u), FromBits(0x7f7fffffu),
  };
  for (size_t i = 0, n = v.size(); i < n; ++i) v.push_back(-v[i]);
  return v;
}

std::vector<float> NanFloats() {
  return {FromBits(0x7fc00000u), FromBits(0xffc00000u), FromBits(0x7f800001u),
          FromBits(0xff800001u), FromBits(0x7fa00000u), FromBits(0x7fffffffu),
          FromBits(0x7f802000u), FromBits(0x7fbfe000u), FromBits(0xff812345u)};
}

TEST_CASE("every 16-bit pattern widens to the value the format defines") {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    for (int kind = 0; kind < 2; ++kind) {
      const bool half = kind == 0;
      const float got = half ? F16ToF32(h) : Bf16ToF32(h);
      const double want = half ? DecodeHalf(h) : DecodeBf16(h);
      if (std::isnan(want)) {
        // NaN stays NaN, with its sign and payload (and signalling stays signalling).
        const int mbits = half ? 10 : 7;
        REQUIRE(std::isnan(got));
        REQUIRE((Bits(got) >> 31) == (b >> 15));
        REQUIRE(((Bits(got) >> (23 - mbits)) & ((1u << mbits) - 1)) == (b & ((1u << mbits) - 1)));
        REQUIRE((Bits(got) & ((1u << (23 - mbits)) - 1)) == 0);
        continue;
      }
      REQUIRE(static_cast<double>(got) == want);
      REQUIRE(std::signbit(got) == static_cast<bool>(b >> 15));
    }
  }
}

TEST_CASE("f32 narrows to the nearest 16-bit value, ties to even") {
  std::vector<float> xs = SpecialFloats();
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    float f = FromBits(rng());
    if (!std::isnan(f)) xs.push_back(f);
    // Concentrate on the f16 range (exponents -30 .. 17) and exact ties.
    const int exp = static_cast<int>(rng() % 48) - 30;
    float g = std::ldexp(static_cast<float>(rng() % 4096) / 2048.0f, exp);
    xs.push_back(rng() & 1 ? -g : g);
  }
  for (float f : xs) {
    INFO("f = " << f << " bits 0x" << std::hex << Bits(f));
    REQUIRE(F32ToF16(f) == RoundRef(f, DecodeHalf, 0x7c00));
    REQUIRE(F32ToBf16(f) == RoundRef(f, DecodeBf16, 0x7f80));
  }
  // Hand-checked anchors.
  CHECK(F32ToF16(65504.0f) == 0x7bff);
  CHECK(F32ToF16(65520.0f) == 0x7c00);
  CHECK(F32ToF16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(F32ToF16(std::ldexp(1.0f, -25)) == 0x0000);   // tie with 0 and 2^-24: even is 0
  CHECK(F32ToF16(std::ldexp(3.0f, -25)) == 0x0002);   // tie between 1 and 2 (x 2^-24): 2
  CHECK(F32ToF16(-0.0f) == 0x8000);
  CHECK(F32ToBf16(1.00390625f) == 0x3f80);            // tie -> even (down)
  CHECK(F32ToBf16(1.01171875f) == 0x3f82);            // tie -> even (up)
  CHECK(F32ToBf16(FromBits(0x7f7f8000u)) == 0x7f80);  // overflow midpoint -> inf
  CHECK(F32ToBf16(std::numeric_limits<float>::denorm_min()) == 0x0000);
}

TEST_CASE("NaN narrows to a quiet NaN with the sign and the top payload bits") {
  for (float f : NanFloats()) {
    const uint32_t u = Bits(f);
    const uint16_t h = F32ToF16(f), b = F32ToBf16(f);
    REQUIRE(IsNan16(h, 10));
    REQUIRE(IsNan16(b, 7));
    REQUIRE((h & 0x0200) != 0);  // quiet bit
    REQUIRE((b & 0x0040) != 0);
    REQUIRE((h >> 15) == (u >> 31));
    REQUIRE((b >> 15) == (u >> 31));
    REQUIRE((h & 0x1ff) == ((u >> 13) & 0x1ff));
    REQUIRE((b & 0x3f) == ((u >> 16) & 0x3f));
  }
}

TEST_CASE("bulk casts give the scalar results bit for bit, at any length and alignment") {
  std::vector<uint16_t> all(65536 + 9);
  for (uint32_t b = 0; b < 65536; ++b) all[b + 1] = static_cast<uint16_t>(b);
  std::vector<float> wide(all.size());
  for (size_t off : {1, 2}) {  // element offset 1: unaligned for 32-byte loads
    const size_t n = 65536 + 9 - off - (off == 2 ? 3 : 0);
    CastF16ToF32(all.data() + off, wide.data(), n);
    for (size_t i = 0; i < n; ++i) REQUIRE(Bits(wide[i]) == Bits(F16ToF32(all[off + i])));
    CastBf16ToF32(all.data() + off, wide.data(), n);
    for (size_t i = 0; i < n; ++i) REQUIRE(Bits(wide[i]) == Bits(Bf16ToF32(all[off + i])));
  }
  std::vector<float> xs = SpecialFloats();
  for (float f : NanFloats()) xs.push_back(f);
  std::mt19937 rng(11);
  for (int i = 0; i < 300000; ++i) xs.push_back(FromBits(rng()));
  for (uint32_t b = 0; b < 65536; ++b) xs.push_back(F16ToF32(static_cast<uint16_t>(b)));
  std::vector<uint16_t> out(xs.size());
  for (size_t n : {xs.size(), xs.size() - 5, size_t{7}, size_t{0}}) {
    CastF32ToF16(xs.data() + 1, out.data(), n > 0 ? n - 1 : 0);
    for (size_t i = 0; i + 1 < n; ++i) REQUIRE(out[i] == F32ToF16(xs[i + 1]));
    CastF32ToBf16(xs.data() + 1, out.data(), n > 0 ? n - 1 : 0);
    for (size_t i = 0; i + 1 < n; ++i) REQUIRE(out[i] == F32ToBf16(xs[i + 1]));
  }
}

TEST_CASE("names, file spellings and sizes") {
  struct Want { DType d; const char* name; const char* st; size_t size; };
  const Want want[] = {
      {DType::kF32, "f32", "F32", 4},   {DType::kBF16, "bf16", "BF16", 2},
      {DType::kF16, "f16", "F16", 2},   {DType::kF64, "f64", "F64", 8},
      {DType::kI32, "i32", "I32", 4},   {DType::kI64, "i64", "I64", 8},
      {DType::kU8, "u8", "U8", 1},      {DType::kBool, "bool", "BOOL", 1},
      {DType::kI8, "i8", "I8", 1},      {DType::kU16, "u16", "U16", 2},
      {DType::kI16, "i16", "I16", 2},   {DType::kU32, "u32", "U32", 4},
      {DType::kU64, "u64", "U64", 8},   {DType::kF8E4M3, "f8_e4m3", "F8_E4M3", 1},
      {DType::kF8E5M2, "f8_e5m2", "F8_E5M2", 1},
  };
  for (const Want& w : want) {
    CHECK(std::string(DTypeName(w.d)) == w.name);
    CHECK(std::string(SafetensorsDTypeName(w.d)) == w.st);
    CHECK(DTypeSize(w.d) == w.size);
    CHECK(ParseSafetensorsDType(w.st).value() == w.d);
  }
  // The comm op header carries the numeric value: the first seven are fixed.
  CHECK(static_cast<int>(DType::kF32) == 0);
  CHECK(static_cast<int>(DType::kU8) == 6);
  CHECK(DTypeSize(static_cast<DType>(200)) == 0);
  CHECK(std::string(DTypeName(static_cast<DType>(200))) == "?");
  absl::StatusOr<DType> bad = ParseSafetensorsDType("f32");  // the file spelling is upper case
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()) == "unknown dtype \"f32\"");
}

}  // namespace
}  // namespace ember::base
