// GemmBf16 (oneDNN where the CPU has bf16 instructions, widened sgemm elsewhere) against a float64
// GEMM of the bf16 inputs, across transposes, odd shapes, padded strides, alpha and beta; the
// run-time dispatch against /proc/cpuinfo; bitwise independence of the pool size in deterministic
// mode. Built twice: gemm_test (the machine's own path) and gemm_widen_test (EMBER_BF16_GEMM=off
// set before the first call: the fp32 path on every CPU).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cast.h"
#include "kernels/gemm.h"
#include "testing/kernel_test_util.h"

#ifdef EMBER_GEMM_TEST_WIDEN
namespace {
const bool kForcedOff = [] { return setenv("EMBER_BF16_GEMM", "off", 1) == 0; }();
}  // namespace
#endif

namespace ember::kernels {
namespace {

using testing::Random;

// The flags line of /proc/cpuinfo has the word.
bool CpuFlag(const std::string& flag) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    return (line + " ").find(" " + flag + " ") != std::string::npos;
  }
  return false;
}

std::vector<uint16_t> RandomBf16(int64_t n, uint64_t seed) {
  auto f = Random(n, seed);
  std::vector<uint16_t> b(n);
  for (int64_t i = 0; i < n; ++i) b[i] = F32ToBf16(f[i]);
  return b;
}

struct Case {
  int64_t M, N, K;
  int64_t pad_a, pad_b, pad_c;  // extra elements per row beyond the minimum leading dimension
};

// Checks GemmBf16 on one case against float64. Tolerance per element: fp32 accumulation of K
// exact products, |err| <= (K + 2) * 2^-23 * (sum_k |alpha a_ik b_kj| + |beta c_ij|) + 1e-30.
void CheckCase(const ExecContext& ctx, const Case& c, bool ta, bool tb, float alpha, float beta) {
  const int64_t a_rows = ta ? c.K : c.M, a_cols = ta ? c.M : c.K;
  const int64_t b_rows = tb ? c.N : c.K, b_cols = tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad_a, ldb = b_cols + c.pad_b, ldc = c.N + c.pad_c;
  auto A = RandomBf16(a_rows * lda, 11 + c.M), B = RandomBf16(b_rows * ldb, 12 + c.N);
  auto C0 = Random(c.M * ldc, 13 + c.K);
  if (beta == 0.0f) {
    // beta = 0 must not read C (BLAS semantics): NaN in C must not reach the result.
    for (int64_t i = 0; i < c.M; ++i) C0[i * ldc] = NAN;
  }
  auto C = C0;
  GemmBf16(ctx, ta, tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  auto a = [&](int64_t i, int64_t k) { return double(Bf16ToF32(ta ? A[k * lda + i] : A[i * lda + k])); };
  auto b = [&](int64_t k, int64_t j) { return double(Bf16ToF32(tb ? B[j * ldb + k] : B[k * ldb + j])); };
  double worst = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double s = 0, abs = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        s += a(i, k) * b(k, j);
        abs += std::fabs(a(i, k) * b(k, j));
      }
      double ref = double(alpha) * s, bound = std::fabs(alpha) * abs;
      if (beta != 0.0f) {
        ref += double(beta) * C0[i * ldc + j];
        bound += std::fabs(double(beta) * C0[i * ldc + j]);
      }
      const double tol = (c.K + 2) * std::ldexp(1.0, -23) * bound + 1e-30;
      const double err = std::fabs(double(C[i * ldc + j]) - ref);
      worst = std::max(worst, err / tol);
    }
    // The padding of C is never written.
    for (int64_t j = c.N; j < ldc; ++j) {
      const float got = C[i * ldc + j], want = C0[i * ldc + j];
      REQUIRE(std::memcmp(&got, &want, 4) == 0);
    }
  }
  INFO("M=" << c.M << " N=" << c.N << " K=" << c.K << " ta=" << ta << " tb=" << tb
            << " alpha=" << alpha << " beta=" << beta << " lda=" << lda << " ldb=" << ldb
            << " ldc=" << ldc);
  CHECK(worst <= 1.0);
}

TEST_CASE("GemmBf16 dispatch follows the CPU's bf16 instructions") {
  const Bf16GemmSupport& s = Bf16GemmInfo();
  INFO(s.reason);
  CHECK_FALSE(s.reason.empty());
  const bool cpu = CpuFlag("avx512_bf16") || CpuFlag("amx_bf16");
  CHECK(s.cpu_bf16 == cpu);
#ifdef EMBER_GEMM_TEST_WIDEN
  REQUIRE(kForcedOff);
  CHECK_FALSE(HasNativeBf16Gemm());
  CHECK(s.reason.find("EMBER_BF16_GEMM=off") != std::string::npos);
#else
  if (std::getenv("EMBER_BF16_GEMM") == nullptr) CHECK(HasNativeBf16Gemm() == cpu);
  if (HasNativeBf16Gemm()) CHECK(s.reason.find("oneDNN") != std::string::npos);
#endif
}

TEST_CASE("GemmBf16 matches a float64 GEMM across transposes, odd shapes and strides") {
  ThreadPool pool(2);
  for (bool det : {true, false}) {
    ExecContext ctx{&pool, det};
    const Case cases[] = {
        {70, 130, 33, 0, 0, 0},  {70, 130, 33, 5, 3, 7},   {1, 257, 19, 1, 2, 3},
        {257, 1, 200, 3, 0, 1},  {129, 67, 300, 9, 11, 2}, {3, 5, 1, 0, 1, 0},
        {200, 96, 64, 0, 0, 0},  {96, 200, 64, 17, 1, 33},
    };
    for (const Case& c : cases) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          CheckCase(ctx, c, ta, tb, 1.0f, 0.0f);
          CheckCase(ctx, c, ta, tb, 0.5f, 2.0f);
        }
      }
    }
    CheckCase(ctx, {64, 64, 64, 0, 0, 0}, false, true, -1.5f, 1.0f);
  }
}

TEST_CASE("GemmBf16 with K = 0 scales C by beta") {
  ThreadPool pool(2);
  ExecContext ctx{&pool, true};
  std::vector<uint16_t> A(1), B(1);
  std::vector<float> C = {1, 2, 3, 4, 5, 6};
  GemmBf16(ctx, false, false, 2, 3, 0, 1.0f, A.data(), 1, B.data(), 3, 0.5f, C.data(), 3);
  CHECK(C == std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3});
}

TEST_CASE("GemmBf16 in deterministic mode is bitwise independent of the pool size") {
  const int64_t M = 1000, N = 384, K = 256;
  auto A = RandomBf16(M * K, 21), B = RandomBf16(N * K, 22);
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    ExecContext ctx{&pool, true};
    std::vector<float> C(M * N);
    GemmBf16(ctx, false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
    // dW-like: C^T-shaped accumulate (trans_a) onto the first result.
    GemmBf16(ctx, true, false, N, K, M, 1.0f, RandomBf16(M * N, 23).data(), N, A.data(), K, 0.0f,
             C.data(), K);
    outs.push_back(C);
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    CHECK(std::memcmp(outs[i].data(), outs[0].data(), outs[0].size() * 4) == 0);
  }
}

}  // namespace
}  // namespace ember::kernels
