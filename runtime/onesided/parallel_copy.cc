#include "runtime/onesided/parallel_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace ember::onesided::internal {

void StreamingCopy(void* dst, const void* src, uint64_t bytes) {
#if defined(__x86_64__)
  if (bytes >= kStreamingCopyMinBytes) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    const uint64_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;  // to a 16-byte boundary
    memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    uint64_t i = 0;
    for (; i + 64 <= bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    _mm_sfence();  // the streamed stores are ordered before whatever announces the bytes
    memcpy(d + i, s + i, bytes - i);
    return;
  }
#endif
  memcpy(dst, src, bytes);
}

ParallelCopier::~ParallelCopier() {
  std::thread helper;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    helper.swap(helper_);
  }
  if (helper.joinable()) helper.join();
}

void ParallelCopier::Work(Job& job) {
  const size_t n = job.chunks.size();
  for (size_t i; (i = job.next.fetch_add(1, std::memory_order_relaxed)) < n;) {
    const Segment& c = job.chunks[i];
    memcpy(c.dst, c.src, c.bytes);
    job.done.fetch_add(1, std::memory_order_release);
  }
}

void ParallelCopier::Copy(const std::vector<Segment>& segments) {
  uint64_t total = 0;
  for (const Segment& s : segments) total += s.bytes;
  if (total < 2 * kChunkBytes) {
    for (const Segment& s : segments) memcpy(s.dst, s.src, s.bytes);
    return;
  }
  Job job;
  job.chunks.reserve(total / kChunkBytes + segments.size());
  for (const Segment& s : segments) {
    for (uint64_t off = 0; off < s.bytes; off += kChunkBytes) {
      job.chunks.push_back({static_cast<char*>(s.dst) + off, static_cast<const char*>(s.src) + off,
                            std::min(kChunkBytes, s.bytes - off)});
    }
  }
  bool shared = false;
  {
    absl::MutexLock l(&mu_);
    if (job_ == nullptr && !stop_) {  // else the helper serves another caller: copy alone
      if (!helper_.joinable()) helper_ = std::thread([this] { HelperLoop(); });
      job_ = &job;
      ++generation_;
      shared = true;
    }
  }
  Work(job);
  if (!shared) return;
  // Every chunk is taken; wait for the helper's last one and for it to leave the job.
  absl::MutexLock l(&mu_);
  const size_t n = job.chunks.size();
  auto finished = [this, &job, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !helper_busy_ && job.done.load(std::memory_order_acquire) == n;
  };
  mu_.Await(absl::Condition(&finished));
  job_ = nullptr;
}

void ParallelCopier::HelperLoop() {
  uint64_t served = 0;
  absl::MutexLock l(&mu_);
  while (true) {
    auto ready = [this, &served]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || (job_ != nullptr && generation_ != served);
    };
    mu_.Await(absl::Condition(&ready));
    if (stop_) return;
    Job* job = job_;
    served = generation_;
    helper_busy_ = true;
    mu_.Unlock();
    Work(*job);
    mu_.Lock();
    helper_busy_ = false;
  }
}

}  // namespace ember::onesided::internal
