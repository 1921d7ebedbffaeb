// Model FLOPs utilisation (MFU, issue 18): what one trained token costs a GptConfig in FLOPs, and
// the dense bf16 tensor-core peak of the GPUs we know. MFU = FLOPs per token x tokens/s / peak.
//
// FLOPs per trained token (docs/model.md, "FLOPs per token and MFU"), a multiply-add counted as 2
// and backward as twice the forward (PaLM's appendix B, also nanoGPT's and llm.c's):
//   6 N + 12 L H Q S
//   N  weights used in a matrix multiply per token: per layer qkv (qkv_width x C), proj (C x C) and
//      the MLP (GELU 2 F C; SwiGLU 3 F C; MoE: the gate E C plus top_k experts' 2 F C), times L,
//      plus the LM head V C (tied or not). Embedding lookups (wte, wpe) and norms are not matmuls.
//   L layers, H query heads, Q head_dim, S keys each query attends to: the sequence length T for
//      full causal attention (not halved for the mask, as PaLM counts, so figures compare), or
//      min(T, window) for a sliding window.
// Elementwise work (norms, GELU, softmax, AdamW) is left out, as those references do.
//
// Thread-safe (pure functions).
#ifndef EMBER_RUNTIME_MODEL_FLOPS_H_
#define EMBER_RUNTIME_MODEL_FLOPS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/model/gpt.h"

namespace ember::model {

// N of the formula above: weights in matrix multiplies per token (MoE: the active ones).
int64_t MatmulParamsPerToken(const GptConfig& c);
// Training (forward + backward) FLOPs per token at sequence length `seq_len`.
double TrainingFlopsPerToken(const GptConfig& c, int64_t seq_len);

struct DevicePeak {
  std::string model;   // e.g. "H100 SXM"
  double flops = 0;    // dense bf16 tensor-core peak, FLOP/s
  std::string source;  // where the number comes from
};

// The dense bf16 peak of the GPU cudaDeviceProp::name calls `device_name`, with compute capability
// cc_major.cc_minor (pass -1, -1 to skip that check). Known: H200 and H100 SXM (989.4 TFLOP/s),
// H100 PCIe (756.5), A100 (312). NOT_FOUND, with a message naming the device and what is known,
// for anything else (H100/H200 NVL, other GPUs) or when the compute capability does not match.
absl::StatusOr<DevicePeak> DenseBf16Peak(const std::string& device_name, int cc_major,
                                         int cc_minor);

}  // namespace ember::model

#endif  // EMBER_RUNTIME_MODEL_FLOPS_H_
