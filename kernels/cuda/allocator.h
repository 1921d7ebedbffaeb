// A caching device allocator with statistics (allocated, reserved, peak), PyTorch-style but small.
//
// Sizes are rounded up (512 B granules below 1 MiB, 2 MiB granules above); a freed block goes to a
// free list keyed by its rounded size and is handed to the next request of that rounded size
// without a cudaMalloc/cudaFree (both synchronise the device). The bookkeeping is device-free:
// memory comes from a Backend (cudaMalloc/cudaFree for the GPU, see cuda_ops.h NewCudaAllocator;
// a counting fake in tests), so every rule here is tested on CPU (allocator_test.cc).
//
// Stream order: reuse is safe for work queued on ONE stream (a block freed after its last use was
// queued can be handed out for later work on the same stream). Callers that use a block on several
// streams must synchronise before Free.
//
// Thread safety: all methods are thread-safe (one mutex).
//
//   CachingAllocator alloc(std::move(backend));
//   ASSIGN_OR_RETURN(void* p, alloc.Allocate(bytes));  ...  alloc.Free(p);
#ifndef EMBER_KERNELS_CUDA_ALLOCATOR_H_
#define EMBER_KERNELS_CUDA_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ember::kernels::cuda {

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // rounded bytes handed out and not yet freed
  int64_t reserved_bytes = 0;        // bytes held from the backend (allocated + cached)
  int64_t peak_allocated_bytes = 0;  // high-water marks since construction or ResetPeak()
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocs = 0;            // Allocate calls that succeeded
  int64_t num_cache_hits = 0;        // of which served from the cache
  int64_t num_backend_allocs = 0;    // backend allocations (cudaMalloc calls)
  int64_t num_backend_frees = 0;
};

class CachingAllocator {
 public:
  class Backend {
   public:
    virtual ~Backend() = default;
    // Returns memory of at least `bytes` or an error (ResourceExhausted when out of memory).
    virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
    virtual void Deallocate(void* p, size_t bytes) = 0;
  };

  // kExact hands every request to the backend at its exact size and returns freed blocks to it
  // at once (no rounding, no cache): under the CUDA interpreter, so that each allocation ends at
  // its guard page and an overrun faults instead of landing in a rounding granule.
  enum class Mode { kCaching, kExact };
  explicit CachingAllocator(std::unique_ptr<Backend> backend, Mode mode = Mode::kCaching);
  // Returns every block to the backend; blocks still allocated are returned too (their owners must
  // be gone by then).
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // bytes == 0 returns nullptr. On backend failure the cache is emptied and the allocation retried
  // once; the error then says how much was asked and how much is held.
  absl::StatusOr<void*> Allocate(size_t bytes);
  // p must come from Allocate on this allocator (nullptr is ignored); InvalidArgument otherwise.
  absl::Status Free(void* p);
  // Returns the cached (free) blocks to the backend.
  void EmptyCache();
  AllocatorStats stats() const;
  void ResetPeak();  // peaks := current values

  static size_t RoundSize(size_t bytes);

 private:
  void EmptyCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<Backend> backend_;
  const Mode mode_;
  mutable absl::Mutex mu_;
  std::unordered_map<void*, size_t> live_ ABSL_GUARDED_BY(mu_);  // ptr -> rounded size
  std::multimap<size_t, void*> cached_ ABSL_GUARDED_BY(mu_);     // rounded size -> free block
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::kernels::cuda

#endif  // EMBER_KERNELS_CUDA_ALLOCATOR_H_
