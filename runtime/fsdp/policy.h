// Mixed-precision policy of FSDP (as PyTorch FSDP2's MixedPrecisionPolicy), with per-parameter
// overrides by name pattern.
//
//   param_dtype   dtype parameters are all-gathered in (the CPU kernels run on the gathered,
//                 rounded values: the linear layers in bf16 where the trainer sets
//                 ExecContext::bf16_linear, fp32 otherwise; the master shard stays fp32)
//   reduce_dtype  dtype gradients are reduce-scattered in. Unset: each parameter's gradient is
//                 reduced in its own param dtype (fp32-kept parameters in fp32, the rest in bf16),
//                 with NO promotion of a mixed unit to fp32. Set: forces one dtype.
//   output_dtype  block outputs are rounded to this dtype in the forward pass
//   overrides     first matching glob ("*", "?") over the parameter name wins; an override's
//                 reduce_dtype beats the policy's.
//
// Pure value types; thread-safe.
//
//   MixedPrecisionPolicy mp{.param_dtype = DataType::kBF16};
//   mp.overrides.push_back({"*ln*", DataType::kF32});   // ln1/ln2/ln_f stay fp32
//   ParamPrecision p = mp.Resolve("blocks.0.ln1.weight");  // {f32, f32}
#ifndef EMBER_RUNTIME_FSDP_POLICY_H_
#define EMBER_RUNTIME_FSDP_POLICY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/types.h"

namespace ember::fsdp {

using comm::DataType;

struct PrecisionOverride {
  std::string pattern;
  std::optional<DataType> param_dtype;
  std::optional<DataType> reduce_dtype;
};

struct ParamPrecision {
  DataType param_dtype = DataType::kF32;
  DataType reduce_dtype = DataType::kF32;
};

struct MixedPrecisionPolicy {
  DataType param_dtype = DataType::kF32;
  std::optional<DataType> reduce_dtype;
  DataType output_dtype = DataType::kF32;
  std::vector<PrecisionOverride> overrides;

  ParamPrecision Resolve(const std::string& name) const;
};

// Glob match: '*' any run (also across '.'), '?' one character (base::GlobMatch, runtime/base/glob.h).
bool GlobMatch(const std::string& pattern, const std::string& name);

// "f32"/"bf16"/"f16" (also "fp32", "float32", "bfloat16", "fp16", "float16"); InvalidArgument
// naming `field` otherwise.
absl::StatusOr<DataType> ParseFloatDtype(const std::string& field, const std::string& s);

// Rounds n fp32 values in place to `t` (no-op for f32).
void RoundTo(DataType t, float* x, int64_t n);

}  // namespace ember::fsdp

#endif  // EMBER_RUNTIME_FSDP_POLICY_H_
