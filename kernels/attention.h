// Causal multi-head self-attention, flash-style: online softmax over key tiles, no T x T matrix,
// and an optional sliding window that skips key tiles outside the band, so the cost is O(T * W)
// instead of O(T^2).
//
// Row t attends to keys j with j <= t and, when window W > 0, t - j < W (W keys including itself).
//   o[t] = sum_j softmax_j(q[t].k[j] / sqrt(hd)) v[j]
//
// Layout: q, k, v, o (and their gradients) are [B, T, H, hd] rows inside bigger buffers: element
// (b, t, h, d) of q is q[(b*T + t) * qkv_stride + h*hd + d]. Pass the pointers into a fused
// qkv[B, T, 3C] buffer with qkv_stride = 3C (q = qkv, k = qkv + C, v = qkv + 2C), and o[B, T, C]
// with o_stride = C. lse[B, H, T] is the per-row log-sum-exp of the scaled scores, saved for the
// backward pass.
//
// Grouped-query attention: with KV < H key/value heads (KV divides H), query head h reads key and
// value head h / (H / KV); q rows hold H heads, k and v rows KV heads, all with the same row stride
// (a fused [B, T, (H + 2 KV) hd] buffer: q = qkv, k = qkv + H hd, v = qkv + (H + KV) hd). The
// backward runs one task per (batch, kv head) and adds the group's query heads into dk/dv in head
// order, so it is as deterministic as with KV = H.
//
// Determinism: forward is deterministic for any thread count. Backward is deterministic in
// ctx.deterministic mode (one task per (batch, head), dq summed over key tiles in order); otherwise
// key tiles of one head may be split across threads with per-split dq buffers summed afterwards,
// which is faster when B*H is small but rounds differently for different thread counts.
//
// Thread safety: reentrant; blocks until done.
#ifndef EMBER_KERNELS_ATTENTION_H_
#define EMBER_KERNELS_ATTENTION_H_

#include <cstdint>

#include "kernels/exec_context.h"

namespace ember::kernels {

struct AttentionShape {
  int64_t B = 1, T = 1, H = 1, hd = 64;
  int64_t window = 0;  // 0: full causal; W > 0: sliding window of W keys
  int64_t KV = 0;      // key/value heads; 0: H (multi-head attention). Must divide H.
  int64_t kv_heads() const { return KV > 0 ? KV : H; }
};

// o (written), lse[B*H*T] (written).
void AttentionForward(const ExecContext& ctx, const AttentionShape& s, const float* q,
                      const float* k, const float* v, int64_t qkv_stride, float* o,
                      int64_t o_stride, float* lse);

// dq, dk, dv are written (same layout and stride as q, k, v; they may point into one dqkv buffer).
void AttentionBackward(const ExecContext& ctx, const AttentionShape& s, const float* q,
                       const float* k, const float* v, int64_t qkv_stride, const float* o,
                       const float* dout, int64_t o_stride, const float* lse, float* dq,
                       float* dk, float* dv);

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_ATTENTION_H_
