// f32 <-> bf16 / f16 conversions with round-to-nearest-even. NaN stays NaN (quiet), overflow
// rounds to +-inf, f16 subnormals are produced and read exactly. Elements are raw uint16 bits.
// Thread safety: pure functions.
#ifndef EMBER_KERNELS_CAST_H_
#define EMBER_KERNELS_CAST_H_

#include <cstdint>
#include <cstring>

#include "kernels/exec_context.h"

namespace ember::kernels {

inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToF16(float f);
float F16ToF32(uint16_t h);

// Bulk casts over n elements, split over the pool.
void CastF32ToBf16(const ExecContext& ctx, const float* in, uint16_t* out, int64_t n);
void CastBf16ToF32(const ExecContext& ctx, const uint16_t* in, float* out, int64_t n);
void CastF32ToF16(const ExecContext& ctx, const float* in, uint16_t* out, int64_t n);
void CastF16ToF32(const ExecContext& ctx, const uint16_t* in, float* out, int64_t n);

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_CAST_H_
