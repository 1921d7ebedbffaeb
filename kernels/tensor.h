// Tensor: a dtype, a shape and a 64-byte-aligned CPU buffer that is either owned (shared between
// copies of the Tensor) or borrowed (caller-owned memory that must outlive every Tensor viewing it).
// Contiguous row-major only; kernels take raw pointers plus dimensions.
//
// Thread safety: a Tensor is thread-compatible (const methods may run concurrently). The live and
// peak byte counters (MemoryStats) are process-wide atomics.
//
//   Tensor x = Tensor::Empty(DType::kF32, {B, T, C});
//   float* p = x.data<float>();
#ifndef EMBER_KERNELS_TENSOR_H_
#define EMBER_KERNELS_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/dtype.h"

namespace ember::kernels {

// The runtime's one element-type enum (runtime/base/dtype.h); the kernels take kF32, kBF16, kF16
// and kI32 tensors.
using DType = base::DType;
using base::DTypeName;  // "f32", "bf16", ...
using base::DTypeSize;
enum class Device { kCPU, kCUDA };

inline constexpr size_t kAlignment = 64;

// 64-byte-aligned allocation; aborts on exhaustion. Counted in MemoryStats.
// Freed blocks of 1 to 256 MiB are kept for reuse by allocations of the same rounded size (at most
// 512 MiB in all), so repeated training steps do not page-fault on fresh buffers; MemoryStats
// counts live bytes only, not these cached blocks.
void* AlignedAlloc(size_t bytes);
void AlignedFree(void* p, size_t bytes);
// Returns the cached free blocks to the system allocator.
void ReleaseCachedBlocks();

// Bytes currently held by AlignedAlloc and the high-water mark since the last ResetPeak().
struct MemoryStats {
  static int64_t live_bytes();
  static int64_t peak_bytes();
  static void ResetPeak();  // peak := live
};

class Tensor {
 public:
  Tensor() = default;
  // Owned, uninitialised / zero-filled storage.
  static Tensor Empty(DType dtype, std::vector<int64_t> shape);
  static Tensor Zeros(DType dtype, std::vector<int64_t> shape);
  // Borrowed storage: `data` is not freed and must outlive this Tensor and its copies.
  static Tensor Borrow(void* data, DType dtype, std::vector<int64_t> shape);

  DType dtype() const { return dtype_; }
  Device device() const { return Device::kCPU; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int64_t numel() const;
  size_t nbytes() const { return numel() * DTypeSize(dtype_); }
  bool defined() const { return data_ != nullptr; }
  bool owned() const { return static_cast<bool>(storage_); }
  std::string ShapeString() const;

  template <typename T> T* data() { return static_cast<T*>(data_); }
  template <typename T> const T* data() const { return static_cast<const T*>(data_); }
  void* raw() { return data_; }

  // Drops this reference (frees owned storage when it is the last one).
  void Reset() { *this = Tensor(); }

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
};

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_TENSOR_H_
