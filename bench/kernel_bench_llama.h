// kernel_bench's Llama figures (issue 22): RoPE forward+backward and grouped-query attention
// forward+backward against the same computation in PyTorch 2.15 CPU (autograd; Hugging Face's
// rotate_half RoPE; GQA by F.scaled_dot_product_attention with enable_gqa, transformers' default),
// and a Llama-shaped training step (RoPE, GQA, SwiGLU, untied head, AdamW) against a PyTorch
// implementation of the same model. Ours and PyTorch (the peers venv, bench::TorchPeer) run
// interleaved in rounds, same thread count; figures are medians over the rounds.
#ifndef EMBER_BENCH_KERNEL_BENCH_LLAMA_H_
#define EMBER_BENCH_KERNEL_BENCH_LLAMA_H_

#include <string>
#include <vector>

#include "bench/kernel_bench_cuda.h"
#include "bench/kernel_bench_util.h"
#include "kernels/exec_context.h"

namespace ember::bench {

// `peer.python` empty: no peer (its targets report the peer missing with `peer.missing`). Each
// row's note names the peer's torch version and the thread count of both sides.
std::vector<KernelFigure> BenchLlama(const kernels::ExecContext& ctx, bool quick, int reps,
                                     int threads, const TorchPeer& peer);

}  // namespace ember::bench

#endif  // EMBER_BENCH_KERNEL_BENCH_LLAMA_H_
