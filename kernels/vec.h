// Internal: small loops written so GCC vectorises them (built with -O3 -mavx2 -mfma) and a
// vectorisable exp. Every function is deterministic: fixed summation order for a given length.
#ifndef EMBER_KERNELS_VEC_H_
#define EMBER_KERNELS_VEC_H_

#include <cstdint>
#include <cstring>

namespace ember::kernels::vec {

// exp(x) to ~2 ulp for x in [-87, 88] (Cephes expf polynomial); x below -87 gives ~1e-38, not 0.
inline float Exp(float x) {
  // Branch-free so loops calling it vectorise: clamp by selects, round by the 1.5*2^23 trick.
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float kRound = 12582912.0f;
  float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return y * scale;
}

inline float Tanh(float x) {
  float e = Exp(2.0f * x);
  return 1.0f - 2.0f / (e + 1.0f);
}

inline constexpr int kLanes = 16;

inline float Sum(const float* a, int64_t n) {
  float acc[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j];
  float s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; i < n; ++i) s += a[i];
  return s;
}

inline float Dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Max of a[0, n), n >= 1. Lanes start at a[0] and only take larger values, so (as in a plain
// scan) a NaN is returned only when a[0] is NaN.
inline float Max(const float* a, int64_t n) {
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = a[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = a[i + j] > acc[j] ? a[i + j] : acc[j];
  float m = acc[0];
  for (int j = 1; j < kLanes; ++j) m = acc[j] > m ? acc[j] : m;
  for (; i < n; ++i) m = a[i] > m ? a[i] : m;
  return m;
}

// y += alpha * x
inline void Axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

inline void Scale(float alpha, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

}  // namespace ember::kernels::vec

#endif  // EMBER_KERNELS_VEC_H_
