#include "runtime/base/dtype.h"

#include <cpuid.h>
#include <immintrin.h>

#include "absl/strings/str_cat.h"

namespace ember::base {
namespace {

struct Entry {
  DType d;
  const char* name;         // Ember's spelling
  const char* safetensors;  // the safetensors / checkpoint spelling
  size_t size;
};
constexpr Entry kTable[] = {
    {DType::kF32, "f32", "F32", 4},          {DType::kBF16, "bf16", "BF16", 2},
    {DType::kF16, "f16", "F16", 2},          {DType::kF64, "f64", "F64", 8},
    {DType::kI32, "i32", "I32", 4},          {DType::kI64, "i64", "I64", 8},
    {DType::kU8, "u8", "U8", 1},             {DType::kBool, "bool", "BOOL", 1},
    {DType::kI8, "i8", "I8", 1},             {DType::kU16, "u16", "U16", 2},
    {DType::kI16, "i16", "I16", 2},          {DType::kU32, "u32", "U32", 4},
    {DType::kU64, "u64", "U64", 8},          {DType::kF8E4M3, "f8_e4m3", "F8_E4M3", 1},
    {DType::kF8E5M2, "f8_e5m2", "F8_E5M2", 1},
};

const Entry* Find(DType d) {
  for (const Entry& e : kTable)
    if (e.d == d) return &e;
  return nullptr;
}

// AVX2 + F16C paths, 8 elements per step; the tail goes through the scalar functions. Selected at
// run time (the build targets x86-64-v2), so only these functions carry the target attribute.
#define EMBER_AVX2 __attribute__((target("avx2,f16c")))

bool HasAvx2F16c() {
  static const bool ok = [] {
    __builtin_cpu_init();
    // "avx2" also checks that the OS saves the YMM registers. clang has no "f16c" name for
    // __builtin_cpu_supports, so F16C comes from CPUID leaf 1 (ECX bit 29).
    unsigned a, b, c, d;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  }();
  return ok;
}

EMBER_AVX2 void F32ToBf16Avx2(const float* in, uint16_t* out, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i hi = _mm256_srli_epi32(x, 16);
    // Same arithmetic as F32ToBf16: add 0x7fff + lsb, keep the top half; NaN: set the quiet bit.
    const __m256i lsb = _mm256_and_si256(hi, one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, lsb)), 16);
    // |x| > inf; |x| >= 0, so the signed compare is right.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
    // 8 x u32 (each <= 0xffff) -> 8 x u16: pack within lanes, then gather the two lanes' halves.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) out[i] = F32ToBf16(in[i]);
}

EMBER_AVX2 void Bf16ToF32Avx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), x);
  }
  for (; i < n; ++i) out[i] = Bf16ToF32(in[i]);
}

EMBER_AVX2 void F32ToF16Avx2(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = F32ToF16(in[i]);
}

// Not VCVTPH2PS: it quiets signalling NaNs, F16ToF32 keeps them. Integer rebias instead (exact):
// normals and inf/NaN by adding to the exponent, subnormals and zero by a float subtraction.
EMBER_AVX2 void F16ToF32Avx2(const uint16_t* in, float* out, size_t n) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7c00 << 13), rebias = _mm256_set1_epi32(112 << 23);
  const __m256i one_exp = _mm256_set1_epi32(1 << 23), sign_mask = _mm256_set1_epi32(0x8000);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fff), zero = _mm256_setzero_si256();
  const __m256 magic = _mm256_castsi256_ps(_mm256_set1_epi32(113 << 23));  // 2^-14
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256i h = _mm256_cvtepu16_epi32(h16);
    __m256i o = _mm256_slli_epi32(_mm256_and_si256(h, abs_mask), 13);  // exponent/mantissa
    const __m256i exp = _mm256_and_si256(o, exp_mask);
    o = _mm256_add_epi32(o, rebias);
    // inf / NaN: exponent 31 -> 255 (a second rebias).
    o = _mm256_add_epi32(o, _mm256_and_si256(_mm256_cmpeq_epi32(exp, exp_mask), rebias));
    // zero / subnormal: mant * 2^-24 = (2^-14 * (1 + mant/1024)) - 2^-14, exact in f32.
    const __m256i sub = _mm256_castps_si256(
        _mm256_sub_ps(_mm256_castsi256_ps(_mm256_add_epi32(o, one_exp)), magic));
    o = _mm256_blendv_epi8(o, sub, _mm256_cmpeq_epi32(exp, zero));
    o = _mm256_or_si256(o, _mm256_slli_epi32(_mm256_and_si256(h, sign_mask), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), o);
  }
  for (; i < n; ++i) out[i] = F16ToF32(in[i]);
}

#undef EMBER_AVX2

}  // namespace

size_t DTypeSize(DType d) {
  const Entry* e = Find(d);
  return e ? e->size : 0;
}

const char* DTypeName(DType d) {
  const Entry* e = Find(d);
  return e ? e->name : "?";
}

const char* SafetensorsDTypeName(DType d) {
  const Entry* e = Find(d);
  return e ? e->safetensors : "?";
}

absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name) {
  for (const Entry& e : kTable)
    if (name == e.safetensors) return e.d;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

void CastF32ToBf16(const float* in, uint16_t* out, size_t n) {
  if (HasAvx2F16c()) return F32ToBf16Avx2(in, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = F32ToBf16(in[i]);
}

void CastBf16ToF32(const uint16_t* in, float* out, size_t n) {
  if (HasAvx2F16c()) return Bf16ToF32Avx2(in, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToF32(in[i]);
}

void CastF32ToF16(const float* in, uint16_t* out, size_t n) {
  if (HasAvx2F16c()) return F32ToF16Avx2(in, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = F32ToF16(in[i]);
}

void CastF16ToF32(const uint16_t* in, float* out, size_t n) {
  if (HasAvx2F16c()) return F16ToF32Avx2(in, out, n);
  for (size_t i = 0; i < n; ++i) out[i] = F16ToF32(in[i]);
}

}  // namespace ember::base
