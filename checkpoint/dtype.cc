#include "checkpoint/dtype.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ember::ckpt {

absl::Status ConvertDType(DType from, const void* src, DType to, void* dst, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * DTypeSize(from));
    return absl::OkStatus();
  }
  auto is_float = [](DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; };
  if (is_float(from) && is_float(to)) {
    // Through float32: widening is exact, narrowing rounds to nearest even once.
    std::vector<float> tmp;
    const float* f32 = static_cast<const float*>(src);
    if (from != DType::kF32) {
      tmp.resize(n);
      if (from == DType::kBF16) base::CastBf16ToF32(static_cast<const uint16_t*>(src), tmp.data(), n);
      if (from == DType::kF16) base::CastF16ToF32(static_cast<const uint16_t*>(src), tmp.data(), n);
      f32 = tmp.data();
    }
    if (to == DType::kF32) {
      std::memcpy(dst, f32, n * 4);
    } else if (to == DType::kBF16) {
      base::CastF32ToBf16(f32, static_cast<uint16_t*>(dst), n);
    } else {
      base::CastF32ToF16(f32, static_cast<uint16_t*>(dst), n);
    }
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat("no conversion from ", SafetensorsDTypeName(from),
                                               " to ", SafetensorsDTypeName(to),
                                               " (supported: between F32, BF16 and F16)"));
}

}  // namespace ember::ckpt
