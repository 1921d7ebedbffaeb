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

// Same fields, in the same order, as kernel_bench.cc's Target.
struct CudaFigure {
  std::string name;
  double value;
  std::optional<double> peer;
  std::optional<double> goal;
  bool higher_is_better;
  std::string unit;
  std::string note;
  std::string peer_error;
};

std::vector<CudaFigure> BenchCuda(bool quick, int reps);

}  // namespace ember::bench

#endif  // EMBER_BENCH_KERNEL_BENCH_CUDA_H_
