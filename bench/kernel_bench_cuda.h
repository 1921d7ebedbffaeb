// kernel_bench --device cuda: the GPU figures of issue 18 (softmax on 128,256-wide rows and
// RMSNorm against device-to-device copy bandwidth measured in the same run; fused LCE peak memory
// against the fp32 logits it never materialises). Without a GPU (or a CUDA build) every figure is
// returned with no peer and peer_error "no GPU: <reason>", so its target reports met: false.
#ifndef EMBER_BENCH_KERNEL_BENCH_CUDA_H_
#define EMBER_BENCH_KERNEL_BENCH_CUDA_H_

#include <optional>
#include <string>
#include <vector>

namespace ember::bench {

// One measured figure of kernel_bench. `peer` is the reference it is compared with (ours in
// another mode, PyTorch, or copy bandwidth); figures with a goal become report targets (goal on
// value/peer). peer_error says why a peer figure is missing.
struct KernelFigure {
  std::string name;
  double value;
  std::optional<double> peer;
  std::optional<double> goal;
  bool higher_is_better;
  std::string unit;
  std::string note;
  std::string peer_error;
};

std::vector<KernelFigure> BenchCuda(bool quick, int reps);

}  // namespace ember::bench

#endif  // EMBER_BENCH_KERNEL_BENCH_CUDA_H_
