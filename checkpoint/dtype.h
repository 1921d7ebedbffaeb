// Element types shared by safetensors and Ember checkpoints, with their safetensors names
// ("F32", "BF16", ...) and the precision conversions a checkpoint may apply on load.
// Pure functions: thread-safe.
#ifndef EMBER_CHECKPOINT_DTYPE_H_
#define EMBER_CHECKPOINT_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::ckpt {

enum class DType {
  kBool, kU8, kI8, kU16, kI16, kF16, kBF16, kU32, kI32, kF32, kU64, kI64, kF64,
  kF8E4M3, kF8E5M2,
};

// Bytes per element (1 for BOOL and the F8 types).
size_t DTypeSize(DType d);
// The safetensors spelling: "BOOL", "U8", ..., "BF16", "F32", "F8_E4M3".
const char* DTypeName(DType d);
// INVALID_ARGUMENT naming the string for an unknown dtype.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Converts `n` elements from `from` to `to` (src and dst may not overlap). Supported: identity,
// F32 -> BF16 (round to nearest even; NaN stays NaN) and BF16 -> F32 (exact). Anything else is
// UNIMPLEMENTED naming both dtypes.
absl::Status ConvertDType(DType from, const void* src, DType to, void* dst, size_t n);

uint16_t F32ToBF16(float f);
float BF16ToF32(uint16_t b);

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_DTYPE_H_
