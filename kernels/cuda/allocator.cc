#include "kernels/cuda/allocator.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ember::kernels::cuda {
namespace {
constexpr size_t kSmallGranule = 512;
constexpr size_t kLargeGranule = size_t{2} << 20;
constexpr size_t kSmallLimit = size_t{1} << 20;
}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<Backend> backend, Mode mode)
    : backend_(std::move(backend)), mode_(mode) {}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
  for (auto& [p, size] : live_) backend_->Deallocate(p, size);
  live_.clear();
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  const size_t g = bytes < kSmallLimit ? kSmallGranule : kLargeGranule;
  return (bytes + g - 1) / g * g;
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = mode_ == Mode::kExact ? bytes : RoundSize(bytes);
  absl::MutexLock lock(&mu_);
  void* p = nullptr;
  if (auto it = cached_.find(size); mode_ == Mode::kCaching && it != cached_.end()) {
    p = it->second;
    cached_.erase(it);
    ++stats_.num_cache_hits;
  } else {
    absl::StatusOr<void*> got = backend_->Allocate(size);
    if (!got.ok() && !cached_.empty()) {
      EmptyCacheLocked();
      got = backend_->Allocate(size);
    }
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          absl::StrCat("device allocation of ", bytes, " bytes (rounded ", size,
                                       ") failed with ", stats_.allocated_bytes,
                                       " bytes allocated: ", got.status().message(),
                                       "; use a smaller batch or token chunk"));
    }
    p = *got;
    stats_.reserved_bytes += size;
    ++stats_.num_backend_allocs;
  }
  live_.emplace(p, size);
  stats_.allocated_bytes += size;
  ++stats_.num_allocs;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return p;
}

absl::Status CachingAllocator::Free(void* p) {
  if (p == nullptr) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = live_.find(p);
  if (it == live_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CachingAllocator::Free: pointer ", reinterpret_cast<uintptr_t>(p),
                     " was not allocated here or was already freed"));
  }
  const size_t size = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= size;
  if (mode_ == Mode::kExact) {
    backend_->Deallocate(p, size);
    stats_.reserved_bytes -= size;
    ++stats_.num_backend_frees;
    return absl::OkStatus();
  }
  cached_.emplace(size, p);
  return absl::OkStatus();
}

void CachingAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (auto& [size, p] : cached_) {
    backend_->Deallocate(p, size);
    stats_.reserved_bytes -= size;
    ++stats_.num_backend_frees;
  }
  cached_.clear();
}

AllocatorStats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  absl::MutexLock lock(&mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace ember::kernels::cuda
