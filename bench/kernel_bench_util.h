// Helpers shared by kernel_bench's CPU figures (kernel_bench.cc, kernel_bench_llama.cc): timing,
// random data, our training step, and running a PyTorch peer script.
#ifndef EMBER_BENCH_KERNEL_BENCH_UTIL_H_
#define EMBER_BENCH_KERNEL_BENCH_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/exec_context.h"
#include "runtime/model/gpt.h"

namespace ember::bench {

double Now();  // seconds, steady clock
// Median wall seconds of `reps` calls of fn.
double TimeMedian(int reps, const std::function<void()>& fn);
// n normal(0, scale) floats from `seed`.
std::vector<float> Rand(int64_t n, uint64_t seed, float scale);

// Tokens/s of our training step (forward, fused LCE, backward, AdamW) on model `c` with B
// sequences of c.context tokens: the median over `steps` steps after 2 warm-up steps. Exits the
// process if a step fails. *peak_bytes: the model's peak activation bytes.
double TrainStep(const kernels::ExecContext& ctx, const model::GptConfig& c, int64_t B, int steps,
                 int64_t* peak_bytes);

// Runs `script` (Python source) with `python` and the given arguments, under OMP_NUM_THREADS =
// threads, and returns the number on its last line of output. UNAVAILABLE, with the tail of its
// output, when it fails or prints no positive number.
absl::StatusOr<double> RunTorchPeer(const std::string& python, const std::string& script,
                                    const std::string& args, int threads);

// Python pieces shared by the model peers: an RMSNorm module (eps 1e-5, `nn`/`torch` imported),
// and the loop that trains `m` (forward(idx, tgt) -> loss) with AdamW for steps + 2 steps on
// random [B, T] tokens below V and prints tokens/s (median after 2 warm-up steps).
extern const char kTorchRmsNorm[];
extern const char kTorchTrainLoop[];

}  // namespace ember::bench

#endif  // EMBER_BENCH_KERNEL_BENCH_UTIL_H_
