// CUDA causal / sliding-window attention against the CPU flash kernel (kernels/attention.h):
// fused qkv layout, windows 0 (dense), 1, 37, 64 and 100 over T = 200 (ragged last tile), head
// sizes 32 and 64; outputs poisoned before each of two runs, bitwise determinism. SKIPs without GPU.
#include "kernels/cuda/gpu_test_util.h"

#ifndef EMBER_WITH_CUDA
EMBER_CUDA_SKIP_FILE("attention")
#else

#include "kernels/attention.h"

namespace ember::kernels::cuda {
namespace {

TEST_CASE("cuda attention forward/backward match the CPU flash kernel") {
  CudaContext* ctx = GpuOrSkip("attention");
  if (ctx == nullptr) return;
  for (int64_t hd : {32, 64}) {
    for (int64_t window : {0, 1, 37, 64, 100}) {
      AttentionShape s{2, 200, 3, hd, window};
      INFO("hd " << hd << " window " << window);
      const int64_t C = s.H * s.hd, rows = s.B * s.T;
      std::vector<float> qkv = Random(rows * 3 * C, 10 + window), dout = Random(rows * C, 11);
      DeviceBuffer<float> dqkv_in(ctx, qkv), ddout(ctx, dout), o(ctx, rows * C);
      DeviceBuffer<float> lse(ctx, s.B * s.H * s.T), dqkv(ctx, rows * 3 * C);
      float* q = dqkv_in.get();
      auto f = RunTwice<float>(ctx, {{&o, {}}, {&lse, {}}}, [&] {
        return AttentionForward(*ctx, s, q, q + C, q + 2 * C, 3 * C, o.get(), C, lse.get());
      });
      auto b = RunTwice<float>(ctx, {{&dqkv, {}}}, [&] {
        float* d = dqkv.get();
        return AttentionBackward(*ctx, s, q, q + C, q + 2 * C, 3 * C, o.get(), ddout.get(), C,
                                 lse.get(), d, d + C, d + 2 * C);
      });
      std::vector<float> wo(rows * C), wl(s.B * s.H * s.T), wd(rows * 3 * C);
      const float* hq = qkv.data();
      kernels::AttentionForward(kCpu, s, hq, hq + C, hq + 2 * C, 3 * C, wo.data(), C, wl.data());
      kernels::AttentionBackward(kCpu, s, hq, hq + C, hq + 2 * C, 3 * C, wo.data(), dout.data(), C,
                                 wl.data(), wd.data(), wd.data() + C, wd.data() + 2 * C);
      CHECK(ErrRatio(f[0], wo, 1e-5) <= 1);
      CHECK(ErrRatio(f[1], wl, 1e-5) <= 1);
      CHECK(ErrRatio(b[0], wd, 1e-5) <= 1);
    }
  }
  AttentionShape bad{1, 8, 1, 48, 0};
  DeviceBuffer<float> x(ctx, 8 * 3 * 48), o(ctx, 8 * 48), l(ctx, 8);
  CHECK(AttentionForward(*ctx, bad, x.get(), x.get() + 48, x.get() + 96, 144, o.get(), 48, l.get())
            .code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
