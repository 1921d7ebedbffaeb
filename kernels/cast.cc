#include "kernels/cast.h"

namespace ember::kernels {

uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
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

float F16ToF32(uint16_t h) {
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

namespace {
template <typename In, typename Out, typename Fn>
void CastLoop(const ExecContext& ctx, const In* in, Out* out, int64_t n, Fn fn) {
  auto body = [&](int64_t b, int64_t e) { for (int64_t i = b; i < e; ++i) out[i] = fn(in[i]); };
  if (ctx.pool) ctx.pool->ParallelFor(n, 1 << 16, body); else body(0, n);
}
}  // namespace

void CastF32ToBf16(const ExecContext& ctx, const float* in, uint16_t* out, int64_t n) {
  CastLoop(ctx, in, out, n, F32ToBf16);
}
void CastBf16ToF32(const ExecContext& ctx, const uint16_t* in, float* out, int64_t n) {
  CastLoop(ctx, in, out, n, Bf16ToF32);
}
void CastF32ToF16(const ExecContext& ctx, const float* in, uint16_t* out, int64_t n) {
  CastLoop(ctx, in, out, n, F32ToF16);
}
void CastF16ToF32(const ExecContext& ctx, const uint16_t* in, float* out, int64_t n) {
  CastLoop(ctx, in, out, n, F16ToF32);
}

}  // namespace ember::kernels
