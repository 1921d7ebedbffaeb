// CUDA causal / sliding-window attention against the CPU flash kernel (kernels/attention.h):
// fused qkv layout, windows 0 (dense), 1, 37, 64 and 100 over T = 200 (ragged last tile), head
// sizes 32 and 64; grouped-query attention with 8 query heads over KV = 1, 2 and 8 key/value heads
// at odd T = 131 (a [B, T, (H + 2 KV) hd] buffer), dense and windowed; outputs poisoned before each
// of two runs, bitwise determinism. SKIPs without GPU.
//
// Tolerance 1e-5 of the reference's largest magnitude (ErrRatio): the GPU and the CPU kernel sum
// the same fp32 products in different orders (the CPU in 64-wide OpenBLAS tiles, the GPU one key or
// query at a time); an output sums at most T = 200 terms (dk/dv under GQA: group * T = 8 * 131 =
// 1048), whose rounding (2^-24 each, random-walk growth ~ sqrt(n)) stays near 1e-6 of the typical
// term. Measured on CPU for the GQA cases (a float64 reference, and the CUDA kernels' code run in
// a host emulation with glibc's expf): CPU kernel vs float64 at most 8.9e-7, emulated GPU kernels
// vs float64 1.0e-6, emulated vs CPU 1.1e-6 (all of the reference's largest magnitude): ~9x margin.
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

TEST_CASE("cuda grouped-query attention matches the CPU flash kernel") {
  CudaContext* ctx = GpuOrSkip("attention_gqa");
  if (ctx == nullptr) return;
  for (int64_t hd : {32, 64}) {
    for (int64_t KV : {1, 2, 8}) {
      for (int64_t window : {0, 1, 37}) {
        AttentionShape s{2, 131, 8, hd, window, KV};
        INFO("hd " << hd << " KV " << KV << " window " << window);
        const int64_t Cq = s.H * hd, Ckv = KV * hd, W = Cq + 2 * Ckv, rows = s.B * s.T;
        std::vector<float> qkv = Random(rows * W, 20 + KV + window);
        std::vector<float> dout = Random(rows * Cq, 21 + KV);
        DeviceBuffer<float> dqkv_in(ctx, qkv), ddout(ctx, dout), o(ctx, rows * Cq);
        DeviceBuffer<float> lse(ctx, s.B * s.H * s.T), dqkv(ctx, rows * W);
        float* q = dqkv_in.get();
        auto f = RunTwice<float>(ctx, {{&o, {}}, {&lse, {}}}, [&] {
          return AttentionForward(*ctx, s, q, q + Cq, q + Cq + Ckv, W, o.get(), Cq, lse.get());
        });
        // Every element of dqkv is an output (dq, dk, dv tile the rows): none may stay NaN.
        auto b = RunTwice<float>(ctx, {{&dqkv, {}}}, [&] {
          float* d = dqkv.get();
          return AttentionBackward(*ctx, s, q, q + Cq, q + Cq + Ckv, W, o.get(), ddout.get(), Cq,
                                   lse.get(), d, d + Cq, d + Cq + Ckv);
        });
        std::vector<float> wo(rows * Cq), wl(s.B * s.H * s.T), wd(rows * W);
        const float* hq = qkv.data();
        kernels::AttentionForward(kCpu, s, hq, hq + Cq, hq + Cq + Ckv, W, wo.data(), Cq,
                                  wl.data());
        kernels::AttentionBackward(kCpu, s, hq, hq + Cq, hq + Cq + Ckv, W, wo.data(), dout.data(),
                                   Cq, wl.data(), wd.data(), wd.data() + Cq,
                                   wd.data() + Cq + Ckv);
        CHECK(ErrRatio(f[0], wo, 1e-5) <= 1);
        CHECK(ErrRatio(f[1], wl, 1e-5) <= 1);
        CHECK(ErrRatio(b[0], wd, 1e-5) <= 1);
      }
    }
  }
  // KV must divide H.
  AttentionShape bad{1, 8, 8, 32, 0, 3};
  const int64_t W = (8 + 2 * 3) * 32;
  DeviceBuffer<float> x(ctx, 8 * W), o(ctx, 8 * 8 * 32), l(ctx, 8 * 8), d(ctx, 8 * W);
  float* p = x.get();
  CHECK(AttentionForward(*ctx, bad, p, p + 256, p + 352, W, o.get(), 256, l.get()).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(AttentionBackward(*ctx, bad, p, p + 256, p + 352, W, o.get(), o.get(), 256, l.get(),
                          d.get(), d.get() + 256, d.get() + 352)
            .code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
