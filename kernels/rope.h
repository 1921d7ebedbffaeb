// Rotary position embeddings (RoPE), interleaved-pair convention (Meta's Llama reference code):
// within each head of width hd, dims (2i, 2i+1) of the row at position t rotate by the angle
// t * inv_freq[i], i in [0, hd/2):
//   y[2i]   = x[2i] cos - x[2i+1] sin
//   y[2i+1] = x[2i] sin + x[2i+1] cos
// The backward is the inverse rotation (the transpose): dx[2i] = dy[2i] cos + dy[2i+1] sin,
// dx[2i+1] = -dy[2i] sin + dy[2i+1] cos.
//
// Frequencies are computed in float32 exactly as Hugging Face transformers does
// (`_compute_default_rope_parameters`, `_compute_llama3_parameters`); docs/model.md spells out
// every operation, and the permutation between this convention and HF's rotate_half one.
//
// Layout: x holds rows [B, T] of `heads` heads of hd floats each, row (b, t) starting at
// x + (b*T + t) * stride. Pass the fused qkv buffer with heads = H + KV to rotate q and k at once.
//
// Thread safety: reentrant; blocks until done. Deterministic for any pool size (elementwise).
#ifndef EMBER_KERNELS_ROPE_H_
#define EMBER_KERNELS_ROPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/exec_context.h"

namespace ember::kernels {

// Llama 3.1's frequency rule (rope_scaling.rope_type "llama3" in Hugging Face's config.json).
struct RopeScaling {
  bool llama3 = false;  // false: no scaling
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position = 8192;
};

// inv_freq[i] for i in [0, hd/2), float32: 1 / theta^(2i / hd), then the llama3 rule if asked.
std::vector<float> RopeInvFreq(int64_t hd, float theta, const RopeScaling& scaling);

// cos/sin of the angles float32(t * inv_freq[i]) for t in [0, T): tables [T, hd/2], each entry
// the float32 rounding of the double-precision cos/sin of the float32 angle.
struct RopeTable {
  int64_t T = 0, half = 0;
  std::vector<float> cos, sin;
};
RopeTable MakeRopeTable(const std::vector<float>& inv_freq, int64_t T);

// In place: rotates every head of every row of x by its position t (forward), or by -t
// (backward, the gradient of the forward). table.T >= T and table.half == hd / 2.
void RopeForward(const ExecContext& ctx, const RopeTable& table, float* x, int64_t B, int64_t T,
                 int64_t heads, int64_t hd, int64_t stride);
void RopeBackward(const ExecContext& ctx, const RopeTable& table, float* dx, int64_t B,
                  int64_t T, int64_t heads, int64_t hd, int64_t stride);

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_ROPE_H_
