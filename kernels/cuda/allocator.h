// A caching device allocator with statistics (allocated, reserved, peak), PyTorch-style but small.
//
// Sizes are rounded up (512 B granules below 1 MiB, 2 MiB granules above); a freed block goes to a
// free list keyed by its rounded size and is handed to the next request of that rounded size
// without a cudaMalloc/cudaFree (both synchronise the device). The bookkeeping is device-free:
// memory comes from a Backend (cudaMalloc/cudaFree for the GPU, see cuda_ops.h NewCudaAllocator;
// a counting fake in tests), so every rule here is tested on CPU (allocator_test.cc).
//
// Stream order (PyTorch's record-stream semantics): a block belongs to the stream it was allocated
// for, and a freed block is handed out again only for that stream, where later work is queued
// after its last use. A block also used on other streams (an NCCL communicator's stream reading a
// gradient, a side copy stream) must say so with RecordStream before Free: Free then records an
// event on each of those streams and the block returns to the cache only once every event
// completed (checked at the next Allocate; never a host sync).
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
#include <utility>
#include <vector>

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
    // Events for RecordStream (cudaEventRecord / cudaEventQuery / cudaEventDestroy). A backend
    // without streams keeps the defaults (no event: the block is reusable at once).
    virtual void* RecordEvent(void* stream) { (void)stream; return nullptr; }
    virtual bool EventDone(void* event) { (void)event; return true; }
    virtual void DestroyEvent(void* event) { (void)event; }
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
  // once; the error then says how much was asked and how much is held. `stream` (a cudaStream_t;
  // null: the default stream) is the stream the block is used on; only blocks freed on it are
  // reused.
  absl::StatusOr<void*> Allocate(size_t bytes, void* stream = nullptr);
  // p (allocated here, not yet freed) is also used by work queued on `stream`; Free waits for
  // that work (through an event) before the block can be reused. No-op for p's own stream.
  absl::Status RecordStream(void* p, void* stream);
  // p must come from Allocate on this allocator (nullptr is ignored); InvalidArgument otherwise.
  absl::Status Free(void* p);
  // Returns the cached (free) blocks to the backend.
  void EmptyCache();
  AllocatorStats stats() const;
  void ResetPeak();  // peaks := current values

  static size_t RoundSize(size_t bytes);

 private:
  struct Block {
    size_t size = 0;                  // rounded
    void* stream = nullptr;           // allocated for
    std::vector<void*> other_streams;  // RecordStream
  };
  struct Pending {                    // freed, waiting for events on other streams
    void* p;
    size_t size;
    void* stream;
    std::vector<void*> events;
  };
  using CacheKey = std::pair<void*, size_t>;  // (stream, rounded size)
  void EmptyCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves pending blocks whose events all completed into the cache.
  void ReapPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<Backend> backend_;
  const Mode mode_;
  mutable absl::Mutex mu_;
  std::unordered_map<void*, Block> live_ ABSL_GUARDED_BY(mu_);
  std::multimap<CacheKey, void*> cached_ ABSL_GUARDED_BY(mu_);  // free blocks
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::kernels::cuda

#endif  // EMBER_KERNELS_CUDA_ALLOCATOR_H_
