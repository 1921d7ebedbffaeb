// CUDA multi-tensor AdamW, global L2 norm and gradient clipping against the CPU reference
// (kernels/ops.h): more tensors than one launch batch holds, a tensor spanning batches, an empty
// one; outputs reset before each of two runs, bitwise determinism. SKIPs without a GPU.
#include "kernels/cuda/gpu_test_util.h"

#ifndef EMBER_WITH_CUDA
EMBER_CUDA_SKIP_FILE("optim")
#else

#include <cmath>

#include "kernels/ops.h"

namespace ember::kernels::cuda {
namespace {

constexpr double kF32Tol = 1e-5;

// Tensor sizes: 40 tensors (> one batch of 24), one of them > 320 chunks of 16K, one empty.
std::vector<int64_t> Sizes() {
  std::vector<int64_t> s;
  for (int i = 0; i < 40; ++i) s.push_back((i * 7919) % 50000 + 1);
  s[3] = 0;
  s[10] = 330 * 16384 + 5;
  return s;
}
std::vector<int64_t> Offsets(const std::vector<int64_t>& s) {
  std::vector<int64_t> o{0};
  for (int64_t n : s) o.push_back(o.back() + n);
  return o;
}

TEST_CASE("cuda multi-tensor AdamW matches the CPU step per tensor") {
  CudaContext* ctx = GpuOrSkip("adamw");
  if (ctx == nullptr) return;
  const auto sizes = Sizes();
  const auto off = Offsets(sizes);
  const int64_t total = off.back();
  std::vector<float> p = Random(total, 1), g = Random(total, 2), m = Random(total, 3, 0.1f);
  std::vector<float> v = Random(total, 4, 0.1f);
  for (auto& x : v) x = x * x;
  DeviceBuffer<float> dp(ctx, total), dg(ctx, g), dm(ctx, total), dv(ctx, total);
  AdamWOptions opt;
  opt.lr = 3e-3f;
  opt.weight_decay = 0.1f;
  std::vector<AdamWTensor> ts;
  for (size_t i = 0; i < sizes.size(); ++i)
    ts.push_back({dp.get() + off[i], dg.get() + off[i], dm.get() + off[i], dv.get() + off[i],
                  sizes[i]});
  auto got = RunTwice<float>(ctx, {{&dp, p}, {&dm, m}, {&dv, v}},
                             [&] { return AdamWStep(*ctx, opt, 3, ts); });
  std::vector<float> wp = p, wm = m, wv = v;
  for (size_t i = 0; i < sizes.size(); ++i)
    kernels::AdamWStep(kCpu, opt, 3, wp.data() + off[i], g.data() + off[i], wm.data() + off[i],
                       wv.data() + off[i], sizes[i]);
  CHECK(ErrRatio(got[0], wp, kF32Tol) <= 1);
  CHECK(ErrRatio(got[1], wm, kF32Tol) <= 1);
  CHECK(ErrRatio(got[2], wv, kF32Tol) <= 1);
}

TEST_CASE("cuda global norm and clipping match the CPU and are deterministic") {
  CudaContext* ctx = GpuOrSkip("clip");
  if (ctx == nullptr) return;
  const auto sizes = Sizes();
  const auto off = Offsets(sizes);
  std::vector<float> g = Random(off.back(), 5);
  DeviceBuffer<float> dg(ctx, g);
  std::vector<std::pair<const float*, int64_t>> cts, host;
  std::vector<std::pair<float*, int64_t>> mts, hmts;
  std::vector<float> hg = g;
  for (size_t i = 0; i < sizes.size(); ++i) {
    cts.emplace_back(dg.get() + off[i], sizes[i]);
    mts.emplace_back(dg.get() + off[i], sizes[i]);
    host.emplace_back(g.data() + off[i], sizes[i]);
    hmts.emplace_back(hg.data() + off[i], sizes[i]);
  }
  absl::StatusOr<double> n1 = GlobalL2Norm(*ctx, cts), n2 = GlobalL2Norm(*ctx, cts);
  REQUIRE(n1.ok());
  REQUIRE(n2.ok());
  CHECK(*n1 == *n2);
  const double want = kernels::GlobalL2Norm(kCpu, host);
  CHECK(std::fabs(*n1 - want) <= 1e-10 * want);

  // max_norm above the norm: nothing changes (bitwise).
  absl::StatusOr<double> same = ClipGradNorm(*ctx, mts, want * 2);
  REQUIRE(same.ok());
  CHECK(dg.Download() == g);
  // Below: scaled like the CPU's.
  auto got = RunTwice<float>(ctx, {{&dg, g}}, [&]() -> absl::Status {
    absl::StatusOr<double> n = ClipGradNorm(*ctx, mts, want / 3);
    return n.ok() ? absl::OkStatus() : n.status();
  });
  kernels::ClipGradNorm(kCpu, hmts, want / 3);
  CHECK(ErrRatio(got[0], hg, kF32Tol) <= 1);
}

}  // namespace
}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
