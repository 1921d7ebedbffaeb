#include "runtime/comm/types.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ember::comm {

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kF32: return 4;
    case DataType::kBF16: return 2;
    case DataType::kF16: return 2;
    case DataType::kF64: return 8;
    case DataType::kI32: return 4;
    case DataType::kI64: return 8;
    case DataType::kU8: return 1;
  }
  return 1;
}

const char* DataTypeName(DataType t) {
  switch (t) {
    case DataType::kF32: return "f32";
    case DataType::kBF16: return "bf16";
    case DataType::kF16: return "f16";
    case DataType::kF64: return "f64";
    case DataType::kI32: return "i32";
    case DataType::kI64: return "i64";
    case DataType::kU8: return "u8";
  }
  return "?";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProduct: return "product";
  }
  return "?";
}

absl::StatusOr<DataType> ParseDataType(absl::string_view name) {
  for (DataType t : kAllDataTypes)
    if (name == DataTypeName(t)) return t;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name) {
  for (ReduceOp op : kAllReduceOps)
    if (name == ReduceOpName(op)) return op;
  return absl::InvalidArgumentError(absl::StrCat("unknown reduce op '", name, "'"));
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    u = sign | ((112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;           // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;          // overflow (incl. rounding) -> inf
  if (abs < 0x38800000u) {                                // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;                   // below half the smallest subnormal
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(e);                // 14 + (113 - e) ... bits to drop
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1))) ++half_m;
    return sign | static_cast<uint16_t>(half_m);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);         // round to nearest even at bit 13
  return sign | static_cast<uint16_t>((r - 0x38000000u) >> 13);
}

namespace {

template <typename T, typename F>
inline void Apply(T* __restrict d, const T* __restrict s, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) d[i] = f(d[i], s[i]);
}

template <typename T>
void ReduceTyped(T* d, const T* s, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        Apply(d, s, n, [](T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); });
      } else {
        Apply(d, s, n, [](T a, T b) { return a + b; });
      }
      return;
    case ReduceOp::kProduct:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        Apply(d, s, n, [](T a, T b) { return static_cast<T>(static_cast<U>(a) * static_cast<U>(b)); });
      } else {
        Apply(d, s, n, [](T a, T b) { return a * b; });
      }
      return;
    case ReduceOp::kMax: Apply(d, s, n, [](T a, T b) { return a < b ? b : a; }); return;
    case ReduceOp::kMin: Apply(d, s, n, [](T a, T b) { return b < a ? b : a; }); return;
  }
}

// 16-bit floats: widen a block to f32, reduce, narrow. Blocks keep the scratch on the stack.
template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void Reduce16(uint16_t* d, const uint16_t* s, size_t n, ReduceOp op) {
  constexpr size_t kBlock = 256;
  float a[kBlock], b[kBlock];
  for (size_t off = 0; off < n; off += kBlock) {
    size_t m = std::min(kBlock, n - off);
    for (size_t i = 0; i < m; ++i) {
      a[i] = Load(d[off + i]);
      b[i] = Load(s[off + i]);
    }
    ReduceTyped(a, b, m, op);
    for (size_t i = 0; i < m; ++i) d[off + i] = Store(a[i]);
  }
}

template <typename T>
void DivideTyped(T* d, size_t n, int k) {
  if constexpr (std::is_integral_v<T>) {
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / static_cast<T>(k));
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = d[i] / static_cast<T>(k);
  }
}

// ReduceMany, blockwise through an accumulator on the stack (so dst may alias a source).
template <typename T>
void ReduceManyTyped(T* d, const void* const* srcs, int k, size_t n, ReduceOp op, int avg_n) {
  constexpr size_t kBlock = 2048 / sizeof(T);
  T acc[kBlock];
  for (size_t off = 0; off < n; off += kBlock) {
    size_t m = std::min(kBlock, n - off);
    std::memcpy(acc, static_cast<const T*>(srcs[0]) + off, m * sizeof(T));
    for (int j = 1; j < k; ++j) ReduceTyped(acc, static_cast<const T*>(srcs[j]) + off, m, op);
    if (avg_n > 0) DivideTyped(acc, m, avg_n);
    std::memcpy(d + off, acc, m * sizeof(T));
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void ReduceMany16(uint16_t* d, const void* const* srcs, int k, size_t n, ReduceOp op, int avg_n) {
  constexpr size_t kBlock = 256;
  float a[kBlock], b[kBlock];
  for (size_t off = 0; off < n; off += kBlock) {
    size_t m = std::min(kBlock, n - off);
    const uint16_t* s0 = static_cast<const uint16_t*>(srcs[0]) + off;
    for (size_t i = 0; i < m; ++i) a[i] = Load(s0[i]);
    for (int j = 1; j < k; ++j) {
      const uint16_t* s = static_cast<const uint16_t*>(srcs[j]) + off;
      for (size_t i = 0; i < m; ++i) b[i] = Load(s[i]);
      ReduceTyped(a, b, m, op);
    }
    if (avg_n > 0) DivideTyped(a, m, avg_n);
    for (size_t i = 0; i < m; ++i) d[off + i] = Store(a[i]);
  }
}

}  // namespace

void ReduceMany(void* dst, const void* const* srcs, int k, size_t n, DataType t, ReduceOp op,
                int avg_n) {
  if (k <= 0 || n == 0) return;
  switch (t) {
    case DataType::kF32: ReduceManyTyped(static_cast<float*>(dst), srcs, k, n, op, avg_n); return;
    case DataType::kF64: ReduceManyTyped(static_cast<double*>(dst), srcs, k, n, op, avg_n); return;
    case DataType::kI32: ReduceManyTyped(static_cast<int32_t*>(dst), srcs, k, n, op, avg_n); return;
    case DataType::kI64: ReduceManyTyped(static_cast<int64_t*>(dst), srcs, k, n, op, avg_n); return;
    case DataType::kU8: ReduceManyTyped(static_cast<uint8_t*>(dst), srcs, k, n, op, avg_n); return;
    case DataType::kBF16:
      ReduceMany16<BF16ToFloat, FloatToBF16>(static_cast<uint16_t*>(dst), srcs, k, n, op, avg_n);
      return;
    case DataType::kF16:
      ReduceMany16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst), srcs, k, n, op, avg_n);
      return;
  }
}

void Reduce(void* dst, const void* src, size_t n, DataType t, ReduceOp op) {
  switch (t) {
    case DataType::kF32: ReduceTyped(static_cast<float*>(dst), static_cast<const float*>(src), n, op); return;
    case DataType::kF64: ReduceTyped(static_cast<double*>(dst), static_cast<const double*>(src), n, op); return;
    case DataType::kI32: ReduceTyped(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, op); return;
    case DataType::kI64: ReduceTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, op); return;
    case DataType::kU8: ReduceTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, op); return;
    case DataType::kBF16:
      Reduce16<BF16ToFloat, FloatToBF16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, op);
      return;
    case DataType::kF16:
      Reduce16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, op);
      return;
  }
}

void FinishAvg(void* buf, size_t n, DataType t, int k) {
  switch (t) {
    case DataType::kF32: DivideTyped(static_cast<float*>(buf), n, k); return;
    case DataType::kF64: DivideTyped(static_cast<double*>(buf), n, k); return;
    case DataType::kI32: DivideTyped(static_cast<int32_t*>(buf), n, k); return;
    case DataType::kI64: DivideTyped(static_cast<int64_t*>(buf), n, k); return;
    case DataType::kU8: DivideTyped(static_cast<uint8_t*>(buf), n, k); return;
    case DataType::kBF16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = FloatToBF16(BF16ToFloat(p[i]) / k);
      return;
    }
    case DataType::kF16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = FloatToHalf(HalfToFloat(p[i]) / k);
      return;
    }
  }
}

}  // namespace ember::comm
