#include "runtime/comm/types.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace ember::comm {

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
    if (name == DTypeName(t)) return t;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

bool IsReducible(DataType t) {
  for (DataType r : kAllDataTypes)
    if (r == t) return true;
  return false;
}

absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name) {
  for (ReduceOp op : kAllReduceOps)
    if (name == ReduceOpName(op)) return op;
  return absl::InvalidArgumentError(absl::StrCat("unknown reduce op '", name, "'"));
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

using base::Bf16ToF32;
using base::F16ToF32;
using base::F32ToBf16;
using base::F32ToF16;

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
      ReduceMany16<Bf16ToF32, F32ToBf16>(static_cast<uint16_t*>(dst), srcs, k, n, op, avg_n);
      return;
    case DataType::kF16:
      ReduceMany16<F16ToF32, F32ToF16>(static_cast<uint16_t*>(dst), srcs, k, n, op, avg_n);
      return;
    default: return;  // not reducible (IsReducible)
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
      Reduce16<Bf16ToF32, F32ToBf16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, op);
      return;
    case DataType::kF16:
      Reduce16<F16ToF32, F32ToF16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, op);
      return;
    default: return;  // not reducible (IsReducible)
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
      for (size_t i = 0; i < n; ++i) p[i] = F32ToBf16(Bf16ToF32(p[i]) / k);
      return;
    }
    case DataType::kF16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = F32ToF16(F16ToF32(p[i]) / k);
      return;
    }
    default: return;  // not reducible (IsReducible)
  }
}

}  // namespace ember::comm
