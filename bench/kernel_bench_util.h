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

// The PyTorch peer of the CPU figures (issue 30: current PyTorch, 2.15): the interpreter, or why
// there is none, and what every peer row names.
struct TorchPeer {
  std::string python;  // empty: no peer; its targets are not measured with `missing`
  std::string missing;
  std::string label;   // "torch 2.15.0+cu132 (/opt/ember-peers/torch-2.15/bin/python)"
  int threads = 1;     // torch.set_num_threads and OMP_NUM_THREADS: ours, the pool size

  // `python_flag` non-empty: that interpreter. Else deploy::CurrentTorchPeerPython():
  // $EMBER_PEER_PYTHON, else the peers venv; never Debian's torch 1.13 behind the user's back (a
  // missing venv leaves `python` empty and `missing` naming deploy/peers-venv.sh). `enabled`
  // false (--peer=false): no peer, missing "peer skipped (--peer=false)".
  static TorchPeer Resolve(bool enabled, const std::string& python_flag, int threads);
  // The threads statement every peer row carries.
  std::string ThreadsText() const;
};

// Runs `script` (Python source) with `python` and the given arguments, under OMP_NUM_THREADS =
// threads, and returns the number on its last line of output. The script must set
// torch.set_num_threads(threads); after it ends, a check appended to it fails the run when
// torch.get_num_threads() is not `threads`. UNAVAILABLE, with the tail of its output, when it
// fails or prints no positive number.
absl::StatusOr<double> RunTorchPeer(const std::string& python, const std::string& script,
                                    const std::string& args, int threads);

// Python pieces shared by the model peers: an RMSNorm module (eps 1e-5, `nn`/`torch` imported),
// and the loop that trains `m` (forward(idx, tgt) -> loss) with AdamW for steps + 2 steps on
// random [B, T] tokens below V and prints tokens/s (median after 2 warm-up steps).
extern const char kTorchRmsNorm[];
extern const char kTorchTrainLoop[];

}  // namespace ember::bench

#endif  // EMBER_BENCH_KERNEL_BENCH_UTIL_H_
