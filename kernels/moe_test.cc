// MoE routing, permutation and grouped linear (CPU reference) against direct definitions.
#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <catch2/catch.hpp>

#include "kernels/ops.h"
#include "testing/kernel_test_util.h"

namespace ember::kernels {
namespace {

using testing::ErrRatio;
using testing::Random;

TEST_CASE("MoeRoute picks the top-k logits (ties to the lower expert) with softmax weights") {
  const int64_t N = 50, E = 8;
  const int k = 3;
  std::vector<float> logits = Random(N * E, 1);
  logits[0 * E + 2] = logits[0 * E + 5] = 9.0f;  // a tie at the top of token 0
  std::vector<int32_t> ex(N * k);
  std::vector<float> w(N * k);
  ThreadPool pool(2);
  MoeRoute(ExecContext{&pool}, logits.data(), N, E, k, ex.data(), w.data());
  CHECK(ex[0] == 2);
  CHECK(ex[1] == 5);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int> idx(E);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](int a, int b) { return logits[n * E + a] > logits[n * E + b]; });
    double z = 0;
    for (int i = 0; i < k; ++i) z += std::exp(double(logits[n * E + idx[i]]));
    for (int i = 0; i < k; ++i) {
      CHECK(ex[n * k + i] == idx[i]);
      CHECK(std::fabs(w[n * k + i] - std::exp(double(logits[n * E + idx[i]])) / z) < 1e-6);
    }
  }
}

TEST_CASE("MoePermute sorts slots by expert, stably, with offsets") {
  const std::vector<int32_t> ex = {2, 0, 2, 1, 0, 2, 3, 0};
  std::vector<int32_t> order(ex.size());
  std::vector<int64_t> off(5);
  MoePermute(ex.data(), ex.size(), 4, order.data(), off.data());
  CHECK(off == std::vector<int64_t>{0, 3, 4, 7, 8});
  CHECK(order == std::vector<int32_t>{1, 4, 7, 3, 0, 2, 5, 6});
}

TEST_CASE("GroupedLinearForward applies each expert's weight to its rows") {
  const int64_t E = 3, in = 16, out = 8;
  const std::vector<int64_t> off = {0, 5, 5, 12};  // expert 1 empty
  std::vector<float> X = Random(12 * in, 2), W = Random(E * out * in, 3), Y(12 * out);
  GroupedLinearForward(ExecContext{}, X.data(), W.data(), off.data(), E, in, out, Y.data());
  std::vector<float> want(12 * out);
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e])
      LinearForward(ExecContext{}, X.data() + off[e] * in, W.data() + e * out * in, nullptr,
                    off[e + 1] - off[e], in, out, want.data() + off[e] * out);
  CHECK(ErrRatio(Y, want, 1e-6) <= 1);
}

}  // namespace
}  // namespace ember::kernels
