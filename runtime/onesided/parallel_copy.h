// Internal to runtime/onesided: a host-memory copy of large transfers done by the calling thread
// and one helper thread together. A single core's copy is bound by its own memory bandwidth
// (about 5-6 GB/s for 64 MiB here, where two cores reach 9-10); the comm layer's shared-memory
// send/recv already moves bytes on two cores (sender and receiver), so a one-sided put or get of
// mapped peer memory uses two as well.
//
// The bytes are split into kChunkBytes chunks taken from a shared counter, so a helper that is
// not scheduled (a loaded machine) costs the caller at most the chunk it holds: the caller copies
// whatever the helper did not take. Thread-safe: concurrent Copy calls are fine; the helper serves
// one at a time and the others copy alone. The helper thread starts on first use and is joined by
// the destructor, which must not run concurrently with Copy.
#ifndef EMBER_RUNTIME_ONESIDED_PARALLEL_COPY_H_
#define EMBER_RUNTIME_ONESIDED_PARALLEL_COPY_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ember::onesided::internal {

// Copies `bytes` from `src` to `dst` (not overlapping) like memcpy, but from kStreamingCopyMinBytes
// on with non-temporal stores (x86-64; memcpy elsewhere): the destination's cache lines are
// written without being read first. For a message just received into a transport buffer (hot in
// cache) and written into a registered region (usually not): the active-message puts and get
// replies over TCP. A 1 MiB chunk into a 64 MiB region: 8-9 GB/s by memcpy, 18 GB/s so (16 MiB:
// 16 vs 18). The bytes are in place when it returns (it fences).
void StreamingCopy(void* dst, const void* src, uint64_t bytes);
inline constexpr uint64_t kStreamingCopyMinBytes = 256 << 10;

class ParallelCopier {
 public:
  struct Segment {
    void* dst;
    const void* src;
    uint64_t bytes;
  };
  static constexpr uint64_t kChunkBytes = 512 << 10;

  ParallelCopier() = default;
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;
  ~ParallelCopier();

  // Copies every segment (non-overlapping) and returns when all bytes are in place; a thread that
  // synchronizes with the caller afterwards sees them. Below two chunks in all, the caller copies
  // alone.
  void Copy(const std::vector<Segment>& segments);

 private:
  struct Job {
    std::vector<Segment> chunks;
    std::atomic<size_t> next{0};  // the next chunk to take
    std::atomic<size_t> done{0};  // chunks copied
  };
  static void Work(Job& job);  // takes and copies chunks until none is left
  void HelperLoop();

  absl::Mutex mu_;
  std::thread helper_ ABSL_GUARDED_BY(mu_);
  Job* job_ ABSL_GUARDED_BY(mu_) = nullptr;  // the job the helper may join; null when none
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // counts published jobs
  bool helper_busy_ ABSL_GUARDED_BY(mu_) = false;  // the helper is inside *job_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ember::onesided::internal

#endif  // EMBER_RUNTIME_ONESIDED_PARALLEL_COPY_H_
