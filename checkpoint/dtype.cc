#include "checkpoint/dtype.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ember::ckpt {

absl::Status ConvertDType(DType from, const void* src, DType to, void* dst, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * DTypeSize(from));
    return absl::OkStatus();
  }
  if (from == DType::kF32 && to == DType::kBF16) {
    base::CastF32ToBf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
    return absl::OkStatus();
  }
  if (from == DType::kBF16 && to == DType::kF32) {
    base::CastBf16ToF32(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat("no conversion from ", SafetensorsDTypeName(from),
                                               " to ", SafetensorsDTypeName(to),
                                               " (supported: F32 <-> BF16)"));
}

}  // namespace ember::ckpt
