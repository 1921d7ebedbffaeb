#include "runtime/model/flops.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ember::model {

int64_t MatmulParamsPerToken(const GptConfig& c) {
  const int64_t C = c.d_model, F = c.ff();
  int64_t mlp = 0;
  switch (c.mlp) {
    case GptConfig::Mlp::kGelu: mlp = 2 * F * C; break;
    case GptConfig::Mlp::kSwiGlu: mlp = 3 * F * C; break;
    case GptConfig::Mlp::kMoe: mlp = c.n_expert * C + c.top_k * 2 * F * C; break;
  }
  const int64_t per_layer = c.qkv_width() * C + C * C + mlp;
  return c.n_layer * per_layer + c.vocab_size * C;
}

double TrainingFlopsPerToken(const GptConfig& c, int64_t seq_len) {
  const int64_t keys = c.window > 0 ? std::min(seq_len, c.window) : seq_len;
  return 6.0 * static_cast<double>(MatmulParamsPerToken(c)) +
         12.0 * static_cast<double>(c.n_layer * c.n_head * c.head_dim()) * static_cast<double>(keys);
}

namespace {

struct Entry {
  const char* model;
  const char* token;   // a word of the device name (split at spaces, '-' and '_'), upper case
  const char* needs;   // another word it must have ("" = none)
  const char* never;   // a word it must not have ("" = none)
  int cc_major, cc_minor;
  double tflops;
  const char* source;
};

// Dense = half of the datasheets' "with sparsity" tensor-core figures.
constexpr Entry kPeaks[] = {
    {"H200", "H200", "", "NVL", 9, 0, 989.4,
     "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BF16 Tensor Core 1,979 TFLOPS with "
     "sparsity, 989.4 dense"},
    {"H100 PCIe", "H100", "PCIE", "NVL", 9, 0, 756.5,
     "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe): BF16 Tensor Core 1,513 TFLOPS with "
     "sparsity, 756.5 dense"},
    {"H100 SXM", "H100", "", "NVL", 9, 0, 989.4,
     "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 Tensor Core 1,979 TFLOPS with "
     "sparsity, 989.4 dense"},
    {"A100", "A100", "", "", 8, 0, 312.0,
     "NVIDIA A100 Tensor Core GPU datasheet: BF16 Tensor Core 312 TFLOPS dense (624 with "
     "sparsity), SXM4 and PCIe alike"},
};

}  // namespace

absl::StatusOr<DevicePeak> DenseBf16Peak(const std::string& device_name, int cc_major,
                                         int cc_minor) {
  std::vector<std::string> words =
      absl::StrSplit(absl::AsciiStrToUpper(device_name), absl::ByAnyChar(" -_"), absl::SkipEmpty());
  auto has = [&](const char* w) { return std::find(words.begin(), words.end(), w) != words.end(); };
  for (const Entry& e : kPeaks) {
    if (!has(e.token) || (*e.needs && !has(e.needs))) continue;
    if (*e.never && has(e.never)) break;  // a variant of this GPU with another peak: not known
    if (cc_major >= 0 && (cc_major != e.cc_major || cc_minor != e.cc_minor)) {
      return absl::NotFoundError(absl::StrCat(
          "device '", device_name, "' looks like an ", e.model, " but reports compute capability ",
          cc_major, ".", cc_minor, " (an ", e.model, " has ", e.cc_major, ".", e.cc_minor,
          "): no dense bf16 peak assumed"));
    }
    return DevicePeak{e.model, e.tflops * 1e12, e.source};
  }
  return absl::NotFoundError(absl::StrCat(
      "no dense bf16 peak known for device '", device_name, "' (compute capability ", cc_major, ".",
      cc_minor, "); the table (runtime/model/flops.cc) has H200, H100 SXM, H100 PCIe and A100"));
}

}  // namespace ember::model
