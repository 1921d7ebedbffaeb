// Test helpers: seeded random data, float64 finite differences, error metrics. testonly.
#ifndef EMBER_TESTING_KERNEL_TEST_UTIL_H_
#define EMBER_TESTING_KERNEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace ember::kernels::testing {

inline std::vector<float> Random(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Central differences of f at x (float64), step h.
inline std::vector<double> NumericGrad(const std::function<double(const std::vector<double>&)>& f,
                                       std::vector<double> x, double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// max_i |a_i - b_i| / (atol + rtol * max_j |b_j|): <= 1 means close (llm.c-style tolerance, scaled
// by the reference's magnitude so near-zero entries do not dominate).
template <typename A, typename B>
double ErrRatio(const A& a, const B& b, double rtol, double atol = 1e-12) {
  double scale = 0, worst = 0;
  for (size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::fabs(double(b[i])));
  for (size_t i = 0; i < b.size(); ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / (atol + rtol * scale));
  return worst;
}

inline double WeightedSum(const std::vector<double>& y, const std::vector<double>& r) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
  return s;
}

}  // namespace ember::kernels::testing

#endif  // EMBER_TESTING_KERNEL_TEST_UTIL_H_
