// Element types of safetensors and Ember checkpoints: the runtime's one enum (runtime/base/dtype.h,
// which also holds the file spellings "F32", "BF16", ... and the 16-bit float conversions), plus
// the precision conversions a checkpoint may apply on load. Pure functions: thread-safe.
#ifndef EMBER_CHECKPOINT_DTYPE_H_
#define EMBER_CHECKPOINT_DTYPE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "runtime/base/dtype.h"

namespace ember::ckpt {

using DType = base::DType;
// Bytes per element (1 for BOOL and the F8 types).
using base::DTypeSize;
// The safetensors / checkpoint-metadata spelling ("F32", "F8_E4M3") and its parser
// (INVALID_ARGUMENT naming the string for an unknown dtype).
using base::ParseSafetensorsDType;
using base::SafetensorsDTypeName;
// Deliberately unusable: files spell dtypes with SafetensorsDTypeName ("F32"). Without this, an
// unqualified DTypeName(d) in checkpoint code would find base::DTypeName ("f32") by argument-
// dependent lookup and write the wrong spelling; with it, such a call does not compile.
const char* DTypeName(DType d) = delete;

// Converts `n` elements from `from` to `to` (src and dst may not overlap). Supported: identity and
// any pair of F32, BF16, F16 (widening exact; narrowing rounds to nearest even once, NaN stays
// NaN). Anything else is UNIMPLEMENTED naming both dtypes.
absl::Status ConvertDType(DType from, const void* src, DType to, void* dst, size_t n);

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_DTYPE_H_
