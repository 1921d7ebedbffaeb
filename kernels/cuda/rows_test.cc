// CUDA RMSNorm and row softmax against the CPU reference (kernels/ops.h): random inputs, outputs
// poisoned before each of two runs, bitwise determinism; vectorised (C % 4 == 0) and scalar
// shapes, and the 128,256-wide softmax row. SKIPs without a GPU.
#include "kernels/cuda/gpu_test_util.h"

#ifndef EMBER_WITH_CUDA
EMBER_CUDA_SKIP_FILE("rows")
#else

#include "kernels/ops.h"

namespace ember::kernels::cuda {
namespace {

constexpr double kF32Tol = 1e-5;

TEST_CASE("cuda RMSNorm forward/backward match the CPU") {
  CudaContext* ctx = GpuOrSkip("rmsnorm");
  if (ctx == nullptr) return;
  for (auto [N, C] : {std::pair<int64_t, int64_t>{67, 768}, {5, 131}, {130, 4096}}) {
    INFO("N=" << N << " C=" << C);
    std::vector<float> x = Random(N * C, 1), w = Random(C, 2), dy = Random(N * C, 3);
    std::vector<float> dw0 = Random(C, 4);
    DeviceBuffer<float> dx_in(ctx, x), dw_in(ctx, w), ddy(ctx, dy);
    DeviceBuffer<float> y(ctx, N * C), rstd(ctx, N), dx(ctx, N * C), dw(ctx, C);
    auto f = RunTwice<float>(ctx, {{&y, {}}, {&rstd, {}}}, [&] {
      return RmsNormForward(*ctx, dx_in.get(), dw_in.get(), N, C, 1e-5f, y.get(), rstd.get());
    });
    auto b = RunTwice<float>(ctx, {{&dx, {}}, {&dw, dw0}}, [&] {
      return RmsNormBackward(*ctx, dx_in.get(), dw_in.get(), rstd.get(), ddy.get(), N, C,
                             dx.get(), dw.get());
    });
    std::vector<float> wy(N * C), wr(N), wdx(N * C), wdw = dw0;
    kernels::RmsNormForward(kCpu, x.data(), w.data(), N, C, 1e-5f, wy.data(), wr.data());
    kernels::RmsNormBackward(kCpu, x.data(), w.data(), wr.data(), dy.data(), N, C, wdx.data(),
                             wdw.data());
    CHECK(ErrRatio(f[0], wy, kF32Tol) <= 1);
    CHECK(ErrRatio(f[1], wr, kF32Tol) <= 1);
    CHECK(ErrRatio(b[0], wdx, kF32Tol) <= 1);
    CHECK(ErrRatio(b[1], wdw, kF32Tol) <= 1);
  }
}

TEST_CASE("cuda softmax forward/backward match the CPU, including 128,256-wide rows") {
  CudaContext* ctx = GpuOrSkip("softmax");
  if (ctx == nullptr) return;
  for (auto [N, C] : {std::pair<int64_t, int64_t>{8, 128256}, {33, 1000}, {7, 77}}) {
    INFO("N=" << N << " C=" << C);
    std::vector<float> x = Random(N * C, 5, 4.0f), dy = Random(N * C, 6);
    DeviceBuffer<float> dx_in(ctx, x), ddy(ctx, dy), y(ctx, N * C), dx(ctx, N * C);
    auto f = RunTwice<float>(ctx, {{&y, {}}}, [&] {
      return SoftmaxForward(*ctx, dx_in.get(), N, C, y.get());
    });
    auto b = RunTwice<float>(ctx, {{&dx, {}}}, [&] {
      return SoftmaxBackward(*ctx, y.get(), ddy.get(), N, C, dx.get());
    });
    std::vector<float> wy(N * C), wdx(N * C);
    kernels::SoftmaxForward(kCpu, x.data(), N, C, wy.data());
    kernels::SoftmaxBackward(kCpu, f[0].data(), dy.data(), N, C, wdx.data());
    CHECK(ErrRatio(f[0], wy, kF32Tol) <= 1);
    CHECK(ErrRatio(b[0], wdx, kF32Tol) <= 1);
    // dx may alias dy.
    auto inplace = RunTwice<float>(ctx, {{&dx, dy}}, [&] {
      return SoftmaxBackward(*ctx, y.get(), dx.get(), N, C, dx.get());
    });
    CHECK(ErrRatio(inplace[0], wdx, kF32Tol) <= 1);
  }
}

}  // namespace
}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
