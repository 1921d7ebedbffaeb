#include "checkpoint/dtype.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ember::ckpt {
namespace {
struct Entry { DType d; const char* name; size_t size; };
constexpr Entry kTable[] = {
    {DType::kBool, "BOOL", 1}, {DType::kU8, "U8", 1},     {DType::kI8, "I8", 1},
    {DType::kU16, "U16", 2},   {DType::kI16, "I16", 2},   {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kU32, "U32", 4},   {DType::kI32, "I32", 4},
    {DType::kF32, "F32", 4},   {DType::kU64, "U64", 8},   {DType::kI64, "I64", 8},
    {DType::kF64, "F64", 8},   {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
};
}  // namespace

size_t DTypeSize(DType d) {
  for (const Entry& e : kTable) if (e.d == d) return e.size;
  return 0;
}

const char* DTypeName(DType d) {
  for (const Entry& e : kTable) if (e.d == d) return e.name;
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const Entry& e : kTable) if (name == e.name) return e.d;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

uint16_t F32ToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, keep the sign
  }
  uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float BF16ToF32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

absl::Status ConvertDType(DType from, const void* src, DType to, void* dst, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * DTypeSize(from));
    return absl::OkStatus();
  }
  if (from == DType::kF32 && to == DType::kBF16) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = F32ToBF16(s[i]);
    return absl::OkStatus();
  }
  if (from == DType::kBF16 && to == DType::kF32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = BF16ToF32(s[i]);
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("no conversion from ", DTypeName(from), " to ", DTypeName(to),
                   " (supported: F32 <-> BF16)"));
}

}  // namespace ember::ckpt
