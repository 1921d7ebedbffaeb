// Device memory layout of GptCuda (gpt_cuda.h): where each parameter lives in the parameter,
// gradient and AdamW-moment arenas, and where each saved activation and backward scratch buffer
// of one step (B x T tokens) lives in the activation arena. Pure host arithmetic, no CUDA, so it
// is tested on CPU (gpt_cuda_plan_test).
//
// Every buffer starts on a kGptCudaAlignFloats boundary (256 bytes: cuBLASLt's default pointer
// alignment assumption, and float4 loads in the row kernels); the arenas themselves come from the
// CUDA caching allocator, whose blocks are cudaMalloc's (256-byte aligned or more). Thread
// safety: plain functions.
#ifndef EMBER_RUNTIME_MODEL_GPT_CUDA_PLAN_H_
#define EMBER_RUNTIME_MODEL_GPT_CUDA_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/gpt.h"

namespace ember::model {

inline constexpr int64_t kGptCudaAlignFloats = 64;

// Offsets (in floats) of ParamSpecs(cfg) in each of the four parameter-shaped arenas, in spec
// order; the host's flat layout (Gpt::params_flat) is the same order without the padding.
struct GptCudaParamLayout {
  std::vector<int64_t> offset;       // device arena offset of spec i
  std::vector<int64_t> host_offset;  // offset of spec i in Gpt's flat buffer
  std::vector<int64_t> numel;
  int64_t total = 0;       // floats in one arena (padding included)
  int64_t host_total = 0;  // Gpt::num_params()
};
GptCudaParamLayout PlanGptCudaParams(const GptConfig& cfg);

// One block's saved activations (Block::Forward's names), offsets in 4-byte words.
struct GptCudaLayerActs {
  int64_t x, ln1, rstd1, qkv, att, lse, xmid, ln2, rstd2, fc1, act;
};
// One step's activation arena for N = B*T tokens: C = d_model, Q = qkv_width, F = ff,
// F1 = 2F (SwiGLU) or F (GELU).
struct GptCudaActLayout {
  int64_t B = 0, T = 0;
  std::vector<GptCudaLayerActs> layers;  // layer l's x is the residual stream entering block l
  int64_t xf = 0, lnf = 0, rstdf = 0;    // residual after the last block [N,C]; ln_f out; rstd [N]
  int64_t dlnf = 0;                      // the loss's gradient w.r.t. ln_f's output [N,C]
  int64_t dx = 0;                        // residual-stream gradient [N,C], updated in place
  int64_t dln = 0, tmp = 0, datt = 0;    // [N,C] scratch of a block's backward
  int64_t dact = 0, dfc1 = 0;            // [N,F], [N,F1]
  int64_t dqkv = 0;                      // [N,Q]
  int64_t tokens = 0, targets = 0, pos = 0;  // int32 [N] each
  int64_t total = 0;                         // 4-byte words in the arena
};
// InvalidArgument for B or T < 1, T > context, or a config Validate() refuses.
absl::StatusOr<GptCudaActLayout> PlanGptCudaActivations(const GptConfig& cfg, int64_t B,
                                                        int64_t T);

}  // namespace ember::model

#endif  // EMBER_RUNTIME_MODEL_GPT_CUDA_PLAN_H_
