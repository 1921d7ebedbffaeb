// DType: the one element-type enum of Ember (comm buffers, kernel tensors, checkpoint tensors), its
// names and sizes, and the 16-bit float conversions every layer uses. Pure functions; thread-safe.
//
//   size_t bytes = n * base::DTypeSize(base::DType::kBF16);               // 2 per element
//   uint16_t b = base::F32ToBf16(x);                                      // round to nearest even
//   base::CastF32ToBf16(src, dst, n);                                     // the same, vectorised
//
// Conversions: f32 -> bf16 / f16 round to nearest, ties to even; overflow goes to +-inf; NaN stays
// NaN (quiet: the quiet bit is set, the top payload bits and the sign are kept, as x86 F16C does);
// f16 subnormals are produced and read exactly. bf16 / f16 -> f32 is exact (a signalling NaN stays
// signalling). The bulk casts give bit for bit the scalar functions' results.
#ifndef EMBER_RUNTIME_BASE_DTYPE_H_
#define EMBER_RUNTIME_BASE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::base {

// The numeric values are stable: the comm op header carries them (the first seven are the comm
// element types). Append new types at the end.
enum class DType : uint8_t {
  kF32, kBF16, kF16, kF64, kI32, kI64, kU8,
  kBool, kI8, kU16, kI16, kU32, kU64, kF8E4M3, kF8E5M2,
};

// Bytes per element (1 for kBool and the f8 types); 0 for a value outside the enum.
size_t DTypeSize(DType d);
// Ember's spelling: "f32", "bf16", "f16", "f64", "i32", "i64", "u8", "bool", ..., "f8_e4m3";
// "?" for a value outside the enum.
const char* DTypeName(DType d);
// The safetensors (and Ember checkpoint) spelling: "F32", "BF16", ..., "BOOL", "F8_E4M3".
const char* SafetensorsDTypeName(DType d);
// Inverse of SafetensorsDTypeName; INVALID_ARGUMENT `unknown dtype "<name>"` otherwise.
absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name);

inline float Bf16ToF32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to the even mantissa
  return static_cast<uint16_t>(u >> 16);
}

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = 113;
    while ((mant & 0x400u) == 0) { mant <<= 1; --e; }
    u = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds to 0
    const int exp = static_cast<int>(abs >> 23);  // biased f32 exponent
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - exp;  // value = mant * 2^(exp-150); f16 subnormal unit is 2^-24
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t v = abs - (112u << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

// Bulk casts of n elements (in and out must not overlap), vectorised with AVX2/F16C where the CPU
// has them (checked once), else the scalar loops; single-threaded (kernels/cast.h splits them over
// a thread pool).
void CastF32ToBf16(const float* in, uint16_t* out, size_t n);
void CastBf16ToF32(const uint16_t* in, float* out, size_t n);
void CastF32ToF16(const float* in, uint16_t* out, size_t n);
void CastF16ToF32(const uint16_t* in, float* out, size_t n);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_DTYPE_H_
