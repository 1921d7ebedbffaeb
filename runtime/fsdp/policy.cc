#include "runtime/fsdp/policy.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/base/dtype.h"
#include "runtime/base/glob.h"

namespace ember::fsdp {

bool GlobMatch(const std::string& p, const std::string& s) { return base::GlobMatch(p, s); }

ParamPrecision MixedPrecisionPolicy::Resolve(const std::string& name) const {
  ParamPrecision r;
  r.param_dtype = param_dtype;
  std::optional<DataType> reduce = reduce_dtype;
  for (const auto& o : overrides) {
    if (!GlobMatch(o.pattern, name)) continue;
    if (o.param_dtype) r.param_dtype = *o.param_dtype;
    if (o.reduce_dtype) reduce = o.reduce_dtype;
    break;
  }
  r.reduce_dtype = reduce.value_or(r.param_dtype);
  return r;
}

absl::StatusOr<DataType> ParseFloatDtype(const std::string& field, const std::string& s) {
  if (s == "f32" || s == "fp32" || s == "float32") return DataType::kF32;
  if (s == "bf16" || s == "bfloat16") return DataType::kBF16;
  if (s == "f16" || s == "fp16" || s == "float16") return DataType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", s, "' is not allowed; use one of f32, bf16, f16"));
}

void RoundTo(DataType t, float* x, int64_t n) {
  if (t != DataType::kBF16 && t != DataType::kF16) return;
  // Narrow and widen back through a block on the stack (the vectorised casts of base/dtype.h).
  constexpr int64_t kBlock = 2048;
  uint16_t tmp[kBlock];
  for (int64_t off = 0; off < n; off += kBlock) {
    const size_t m = static_cast<size_t>(std::min(kBlock, n - off));
    if (t == DataType::kBF16) {
      base::CastF32ToBf16(x + off, tmp, m);
      base::CastBf16ToF32(tmp, x + off, m);
    } else {
      base::CastF32ToF16(x + off, tmp, m);
      base::CastF16ToF32(tmp, x + off, m);
    }
  }
}

}  // namespace ember::fsdp
