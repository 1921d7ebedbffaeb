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
  for (Pending& q : pending_) {
    for (void* e : q.events) backend_->DestroyEvent(e);
    backend_->Deallocate(q.p, q.size);
  }
  pending_.clear();
  for (auto& [p, b] : live_) backend_->Deallocate(p, b.size);
  live_.clear();
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  const size_t g = bytes < kSmallLimit ? kSmallGranule : kLargeGranule;
  return (bytes + g - 1) / g * g;
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  const size_t size = mode_ == Mode::kExact ? bytes : RoundSize(bytes);
  absl::MutexLock lock(&mu_);
  ReapPendingLocked();
  void* p = nullptr;
  if (auto it = cached_.find({stream, size}); mode_ == Mode::kCaching && it != cached_.end()) {
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
  live_.emplace(p, Block{size, stream, {}});
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
  Block b = std::move(it->second);
  live_.erase(it);
  stats_.allocated_bytes -= b.size;
  if (mode_ == Mode::kExact) {  // the interpreter's mode: every block back to the backend at once
    backend_->Deallocate(p, b.size);
    stats_.reserved_bytes -= b.size;
    ++stats_.num_backend_frees;
    return absl::OkStatus();
  }
  if (b.other_streams.empty()) {
    cached_.emplace(CacheKey{b.stream, b.size}, p);
    return absl::OkStatus();
  }
  // Reusable on b.stream once the work queued so far on the other streams is done.
  Pending q{p, b.size, b.stream, {}};
  for (void* s : b.other_streams) {
    if (void* e = backend_->RecordEvent(s)) q.events.push_back(e);
  }
  pending_.push_back(std::move(q));
  return absl::OkStatus();
}

absl::Status CachingAllocator::RecordStream(void* p, void* stream) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(p);
  if (it == live_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CachingAllocator::RecordStream: pointer ", reinterpret_cast<uintptr_t>(p),
                     " is not a live block of this allocator"));
  }
  Block& b = it->second;
  if (stream != b.stream &&
      std::find(b.other_streams.begin(), b.other_streams.end(), stream) == b.other_streams.end()) {
    b.other_streams.push_back(stream);
  }
  return absl::OkStatus();
}

void CachingAllocator::ReapPendingLocked() {
  std::vector<Pending> keep;
  for (Pending& q : pending_) {
    bool done = true;
    for (void* e : q.events) done = done && backend_->EventDone(e);
    if (!done) {
      keep.push_back(std::move(q));
      continue;
    }
    for (void* e : q.events) backend_->DestroyEvent(e);
    cached_.emplace(CacheKey{q.stream, q.size}, q.p);
  }
  pending_.swap(keep);
}

void CachingAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (auto& [key, p] : cached_) {
    const size_t size = key.second;
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
