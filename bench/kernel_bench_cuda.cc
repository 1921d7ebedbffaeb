#include "bench/kernel_bench_cuda.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_ops.h"

#ifdef EMBER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ember::bench {
namespace {

using kernels::cuda::CudaContext;

// The figures, with their goals, before anything is measured.
struct Shapes {
  int64_t softmax_rows, softmax_cols, norm_rows, norm_cols, lce_n, lce_v, lce_d;
};
Shapes ShapesFor(bool quick) {
  if (quick) return {64, 128256, 1024, 4096, 1024, 32768, 512};
  return {4096, 128256, 65536, 4096, 8192, 128256, 768};
}

std::vector<KernelFigure> NoGpu(const Shapes& s, const std::string& why) {
  const std::string reason = "no GPU: " + why;
  return {
      {"cuda_softmax_vs_d2d_copy", 0, std::nullopt, 0.8, true, "GB/s",
       absl::StrFormat("%d x %d fp32 rows", s.softmax_rows, s.softmax_cols), reason},
      {"cuda_rmsnorm_vs_d2d_copy", 0, std::nullopt, 0.8, true, "GB/s",
       absl::StrFormat("%d x %d fp32", s.norm_rows, s.norm_cols), reason},
      {"cuda_lce_peak_vs_logits", 0, std::nullopt, 0.125, false, "bytes",
       absl::StrFormat("N=%d V=%d d=%d", s.lce_n, s.lce_v, s.lce_d), reason},
  };
}

#ifdef EMBER_WITH_CUDA

// Median seconds of `reps` runs of fn on the context's stream, timed with events.
double TimeGpu(CudaContext& ctx, int reps, const std::function<void()>& fn) {
  auto s = static_cast<cudaStream_t>(ctx.stream());
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    fn();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Bytes/s of a device-to-device copy of `bytes` (read + write counted).
double CopyBandwidth(CudaContext& ctx, void* dst, const void* src, size_t bytes, int reps) {
  auto s = static_cast<cudaStream_t>(ctx.stream());
  const double sec = TimeGpu(ctx, reps, [&] {
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  });
  return 2.0 * bytes / sec;
}

#endif  // EMBER_WITH_CUDA

}  // namespace

std::vector<KernelFigure> BenchCuda(bool quick, int reps) {
  const Shapes sh = ShapesFor(quick);
  absl::StatusOr<std::unique_ptr<CudaContext>> made = CudaContext::Create(0);
  if (!made.ok()) return NoGpu(sh, std::string(made.status().message()));
#ifndef EMBER_WITH_CUDA
  return NoGpu(sh, "built without CUDA");
#else
  CudaContext& ctx = **made;
  auto& alloc = ctx.allocator();
  std::vector<KernelFigure> out;
  auto failed = [&](const std::string& why) { return NoGpu(sh, "GPU run failed: " + why); };
  reps = std::max(reps, 3);
  {  // softmax and RMSNorm vs copy bandwidth; buffers sized for the larger of the two
    const int64_t n1 = sh.softmax_rows * sh.softmax_cols, n2 = sh.norm_rows * sh.norm_cols;
    const int64_t n = std::max(n1, n2);
    auto x = alloc.Allocate(n * 4), y = alloc.Allocate(n * 4), w = alloc.Allocate(sh.norm_cols * 4),
         r = alloc.Allocate(sh.norm_rows * 4);
    if (!x.ok() || !y.ok() || !w.ok() || !r.ok()) return failed("allocation");
    float *xf = static_cast<float*>(*x), *yf = static_cast<float*>(*y);
    cudaMemsetAsync(xf, 0, n * 4, static_cast<cudaStream_t>(ctx.stream()));
    cudaMemsetAsync(*w, 0, sh.norm_cols * 4, static_cast<cudaStream_t>(ctx.stream()));
    const double copy1 = CopyBandwidth(ctx, yf, xf, n1 * 4, reps);
    const double sm = 2.0 * n1 * 4 / TimeGpu(ctx, reps, [&] {
      kernels::cuda::SoftmaxForward(ctx, xf, sh.softmax_rows, sh.softmax_cols, yf).IgnoreError();
    });
    const double copy2 = CopyBandwidth(ctx, yf, xf, n2 * 4, reps);
    const double nb = 2.0 * n2 * 4 / TimeGpu(ctx, reps, [&] {
      kernels::cuda::RmsNormForward(ctx, xf, static_cast<float*>(*w), sh.norm_rows, sh.norm_cols,
                                    1e-5f, yf, static_cast<float*>(*r)).IgnoreError();
    });
    if (!ctx.Synchronize().ok()) return failed("softmax/RMSNorm kernels");
    out.push_back({"cuda_softmax_vs_d2d_copy", sm / 1e9, copy1 / 1e9, 0.8, true, "GB/s",
                   absl::StrFormat("%d x %d fp32 rows on %s; reference: cudaMemcpy D2D of the "
                                   "same bytes, same run", sh.softmax_rows, sh.softmax_cols,
                                   ctx.DeviceName()), ""});
    out.push_back({"cuda_rmsnorm_vs_d2d_copy", nb / 1e9, copy2 / 1e9, 0.8, true, "GB/s",
                   absl::StrFormat("%d x %d fp32; reference: D2D copy", sh.norm_rows,
                                   sh.norm_cols), ""});
    for (void* p : {*x, *y, *w, *r}) alloc.Free(p).IgnoreError();
  }
  {  // fused LCE: extra peak device memory vs the fp32 logits alone
    const int64_t N = sh.lce_n, V = sh.lce_v, d = sh.lce_d;
    auto h = alloc.Allocate(N * d * 4), W = alloc.Allocate(V * d * 4), dh = alloc.Allocate(N * d * 4),
         dW = alloc.Allocate(V * d * 4), t = alloc.Allocate(N * 4);
    if (!h.ok() || !W.ok() || !dh.ok() || !dW.ok() || !t.ok()) return failed("LCE allocation");
    auto s = static_cast<cudaStream_t>(ctx.stream());
    cudaMemsetAsync(*h, 0, N * d * 4, s);
    cudaMemsetAsync(*W, 0, V * d * 4, s);
    cudaMemsetAsync(*dW, 0, V * d * 4, s);
    cudaMemsetAsync(*t, 0, N * 4, s);
    alloc.ResetPeak();
    const int64_t before = alloc.stats().allocated_bytes;
    auto res = kernels::cuda::FusedLinearCrossEntropy(
        ctx, kernels::LceOptions{}, static_cast<float*>(*h), static_cast<float*>(*W),
        static_cast<int32_t*>(*t), N, d, V, static_cast<float*>(*dh), static_cast<float*>(*dW));
    if (!res.ok()) return failed(std::string(res.status().message()));
    const double extra = static_cast<double>(alloc.stats().peak_allocated_bytes - before);
    out.push_back({"cuda_lce_peak_vs_logits", extra, static_cast<double>(N) * V * 4, 0.125, false,
                   "bytes",
                   absl::StrFormat("N=%d V=%d d=%d, loss+dh+dW; reference: the fp32 logits alone "
                                   "(a lower bound of F.cross_entropy's peak; torch not run here)",
                                   N, V, d), ""});
    for (void* p : {*h, *W, *dh, *dW, *t}) alloc.Free(p).IgnoreError();
  }
  return out;
#endif
}

}  // namespace ember::bench
