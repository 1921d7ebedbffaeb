// CUDA casts, GELU, SwiGLU, Add and embedding against the CPU reference (kernels/cast.h, ops.h):
// random inputs, outputs poisoned before each of two runs, bitwise determinism. SKIPs without GPU.
#include "kernels/cuda/gpu_test_util.h"

#ifndef EMBER_WITH_CUDA
EMBER_CUDA_SKIP_FILE("elementwise")
#else

#include <cmath>
#include <limits>

#include "kernels/cast.h"
#include "kernels/ops.h"

namespace ember::kernels::cuda {
namespace {

constexpr double kF32Tol = 1e-5;

TEST_CASE("cuda casts f32 <-> bf16 are bit-exact with the CPU's") {
  CudaContext* ctx = GpuOrSkip("casts");
  if (ctx == nullptr) return;
  std::vector<float> x = Random(100003, 1, 10.0f);
  x[0] = std::numeric_limits<float>::infinity();
  x[1] = -std::numeric_limits<float>::infinity();
  x[2] = std::numeric_limits<float>::quiet_NaN();
  x[3] = 1.00390625f;  // a tie: rounds to even
  x[4] = 3.4e38f;      // rounds to inf
  x[5] = 1e-40f;       // subnormal
  DeviceBuffer<float> dx(ctx, x);
  DeviceBuffer<uint16_t> db(ctx, x.size());
  auto got = RunTwice<uint16_t>(ctx, {{&db, {}}}, [&] {
    return CastF32ToBf16(*ctx, dx.get(), db.get(), x.size());
  });
  std::vector<uint16_t> want(x.size());
  kernels::CastF32ToBf16(kCpu, x.data(), want.data(), x.size());
  CHECK(got[0] == want);

  DeviceBuffer<float> back(ctx, x.size());
  auto wide = RunTwice<float>(ctx, {{&back, {}}}, [&] {
    return CastBf16ToF32(*ctx, db.get(), back.get(), x.size());
  });
  std::vector<float> want_wide(x.size());
  kernels::CastBf16ToF32(kCpu, want.data(), want_wide.data(), x.size());
  CHECK(std::memcmp(wide[0].data(), want_wide.data(), x.size() * 4) == 0);
}

TEST_CASE("cuda GELU forward/backward match the CPU") {
  CudaContext* ctx = GpuOrSkip("gelu");
  if (ctx == nullptr) return;
  const int64_t n = 100003;
  std::vector<float> x = Random(n, 2, 3.0f), dy = Random(n, 3);
  DeviceBuffer<float> dx_in(ctx, x), ddy(ctx, dy), y(ctx, n), dx(ctx, n);
  auto f = RunTwice<float>(ctx, {{&y, {}}}, [&] { return GeluForward(*ctx, dx_in.get(), y.get(), n); });
  auto b = RunTwice<float>(ctx, {{&dx, {}}}, [&] {
    return GeluBackward(*ctx, dx_in.get(), ddy.get(), dx.get(), n);
  });
  std::vector<float> wy(n), wdx(n);
  kernels::GeluForward(kCpu, x.data(), wy.data(), n);
  kernels::GeluBackward(kCpu, x.data(), dy.data(), wdx.data(), n);
  CHECK(ErrRatio(f[0], wy, kF32Tol) <= 1);
  CHECK(ErrRatio(b[0], wdx, kF32Tol) <= 1);
}

TEST_CASE("cuda SwiGLU forward/backward match the CPU") {
  CudaContext* ctx = GpuOrSkip("swiglu");
  if (ctx == nullptr) return;
  const int64_t N = 37, F = 301;
  std::vector<float> x = Random(N * 2 * F, 4, 2.0f), dy = Random(N * F, 5);
  DeviceBuffer<float> dxin(ctx, x), ddy(ctx, dy), y(ctx, N * F), dx(ctx, N * 2 * F);
  auto f = RunTwice<float>(ctx, {{&y, {}}}, [&] { return SwiGluForward(*ctx, dxin.get(), N, F, y.get()); });
  auto b = RunTwice<float>(ctx, {{&dx, {}}}, [&] {
    return SwiGluBackward(*ctx, dxin.get(), ddy.get(), N, F, dx.get());
  });
  std::vector<float> wy(N * F), wdx(N * 2 * F);
  kernels::SwiGluForward(kCpu, x.data(), N, F, wy.data());
  kernels::SwiGluBackward(kCpu, x.data(), dy.data(), N, F, wdx.data());
  CHECK(ErrRatio(f[0], wy, kF32Tol) <= 1);
  CHECK(ErrRatio(b[0], wdx, kF32Tol) <= 1);
}

TEST_CASE("cuda Add and AddInPlace are bitwise the CPU's") {
  CudaContext* ctx = GpuOrSkip("add");
  if (ctx == nullptr) return;
  const int64_t n = 100003;
  std::vector<float> a = Random(n, 10, 3.0f), b = Random(n, 11, 5.0f);
  DeviceBuffer<float> da(ctx, a), db(ctx, b), out(ctx, n), y(ctx, n);
  auto s = RunTwice<float>(ctx, {{&out, {}}}, [&] { return Add(*ctx, da.get(), db.get(), out.get(), n); });
  auto acc = RunTwice<float>(ctx, {{&y, b}}, [&] { return AddInPlace(*ctx, da.get(), y.get(), n); });
  std::vector<float> want(n), want_acc = b;
  kernels::Add(kCpu, a.data(), b.data(), want.data(), n);
  kernels::AddInPlace(kCpu, a.data(), want_acc.data(), n);
  CHECK(std::memcmp(s[0].data(), want.data(), n * 4) == 0);
  CHECK(std::memcmp(acc[0].data(), want_acc.data(), n * 4) == 0);
}

TEST_CASE("cuda embedding forward (written, accumulated) and backward match the CPU") {
  CudaContext* ctx = GpuOrSkip("embedding");
  if (ctx == nullptr) return;
  const int64_t V = 50, C = 129, N = 300;
  std::vector<int32_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = static_cast<int32_t>((i * 7 + i / 3) % V);
  std::vector<float> table = Random(V * C, 6), base = Random(N * C, 7), dout = Random(N * C, 8);
  std::vector<float> dtable0 = Random(V * C, 9);
  DeviceBuffer<int32_t> did(ctx, ids);
  DeviceBuffer<float> dtab(ctx, table), out(ctx, N * C), ddout(ctx, dout), dtable(ctx, V * C);
  auto w = RunTwice<float>(ctx, {{&out, {}}}, [&] {
    return EmbeddingForward(*ctx, did.get(), N, dtab.get(), C, out.get(), false);
  });
  auto a = RunTwice<float>(ctx, {{&out, base}}, [&] {
    return EmbeddingForward(*ctx, did.get(), N, dtab.get(), C, out.get(), true);
  });
  auto g = RunTwice<float>(ctx, {{&dtable, dtable0}}, [&] {
    return EmbeddingBackward(*ctx, did.get(), N, ddout.get(), C, dtable.get());
  });
  std::vector<float> ww(N * C), wa = base, wg = dtable0;
  kernels::EmbeddingForward(kCpu, ids.data(), N, table.data(), C, ww.data(), false);
  kernels::EmbeddingForward(kCpu, ids.data(), N, table.data(), C, wa.data(), true);
  kernels::EmbeddingBackward(kCpu, ids.data(), N, dout.data(), C, wg.data());
  CHECK(w[0] == ww);  // a copy: exact
  CHECK(ErrRatio(a[0], wa, kF32Tol) <= 1);
  CHECK(ErrRatio(g[0], wg, kF32Tol) <= 1);
}

}  // namespace
}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
