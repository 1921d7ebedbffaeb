// CPU tests of the caching allocator's bookkeeping (allocator.h) over a counting fake backend.
#include "kernels/cuda/allocator.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

namespace ember::kernels::cuda {
namespace {

// malloc-backed, with a capacity to simulate running out of device memory.
class FakeBackend : public CachingAllocator::Backend {
 public:
  explicit FakeBackend(int64_t capacity, int64_t* live) : capacity_(capacity), live_(live) {}
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (*live_ + static_cast<int64_t>(bytes) > capacity_)
      return absl::ResourceExhaustedError("fake device is full");
    *live_ += bytes;
    return std::malloc(bytes);
  }
  void Deallocate(void* p, size_t bytes) override {
    *live_ -= bytes;
    std::free(p);
  }

 private:
  int64_t capacity_;
  int64_t* live_;
};

TEST_CASE("RoundSize uses 512 B granules below 1 MiB and 2 MiB above") {
  CHECK(CachingAllocator::RoundSize(1) == 512);
  CHECK(CachingAllocator::RoundSize(512) == 512);
  CHECK(CachingAllocator::RoundSize(513) == 1024);
  CHECK(CachingAllocator::RoundSize((1 << 20) - 1) == (1 << 20));
  CHECK(CachingAllocator::RoundSize(1 << 20) == (2 << 20));
  CHECK(CachingAllocator::RoundSize((2 << 20) + 1) == (4 << 20));
}

TEST_CASE("allocated, reserved and peak follow allocations, frees and cache reuse") {
  int64_t backend_live = 0;
  {
    CachingAllocator a(std::make_unique<FakeBackend>(int64_t{1} << 30, &backend_live));
    void* p = *a.Allocate(1000);  // 1024
    void* q = *a.Allocate(3 << 20);  // 4 MiB
    AllocatorStats s = a.stats();
    CHECK(s.allocated_bytes == 1024 + (4 << 20));
    CHECK(s.reserved_bytes == s.allocated_bytes);
    CHECK(s.num_backend_allocs == 2);
    CHECK(backend_live == s.reserved_bytes);

    REQUIRE(a.Free(q).ok());
    s = a.stats();
    CHECK(s.allocated_bytes == 1024);
    CHECK(s.reserved_bytes == 1024 + (4 << 20));  // cached, not returned
    CHECK(s.peak_allocated_bytes == 1024 + (4 << 20));

    void* r = *a.Allocate((3 << 20) + 5);  // same rounded size: served from the cache
    CHECK(r == q);
    s = a.stats();
    CHECK(s.num_cache_hits == 1);
    CHECK(s.num_backend_allocs == 2);

    void* t = *a.Allocate(1 << 20);  // different size: a new backend block
    CHECK(t != q);
    CHECK(a.stats().num_backend_allocs == 3);

    REQUIRE(a.Free(r).ok());
    REQUIRE(a.Free(t).ok());
    a.ResetPeak();
    CHECK(a.stats().peak_allocated_bytes == 1024);
    a.EmptyCache();
    s = a.stats();
    CHECK(s.reserved_bytes == 1024);
    CHECK(s.num_backend_frees == 2);
    CHECK(backend_live == 1024);
    CHECK(a.Allocate(0).value() == nullptr);
    (void)p;  // still allocated: returned by the destructor
  }
  CHECK(backend_live == 0);
}

TEST_CASE("a failed allocation empties the cache and retries; a bad free is rejected") {
  int64_t backend_live = 0;
  CachingAllocator a(std::make_unique<FakeBackend>(6 << 20, &backend_live));
  void* p = *a.Allocate(4 << 20);
  REQUIRE(a.Free(p).ok());  // 4 MiB cached
  absl::StatusOr<void*> q = a.Allocate(6 << 20);  // only fits once the cache is returned
  REQUIRE(q.ok());
  CHECK(a.stats().reserved_bytes == (6 << 20));
  absl::StatusOr<void*> r = a.Allocate(1);
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(r.status().message().find("1 bytes") != std::string::npos);
  CHECK(a.Free(reinterpret_cast<void*>(0x1234)).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(a.Free(*q).ok());
  CHECK(a.Free(*q).code() == absl::StatusCode::kInvalidArgument);  // double free
  CHECK(a.Free(nullptr).ok());
}

TEST_CASE("kExact passes exact sizes to the backend and frees at once (the interpreter's mode)") {
  int64_t live = 0;
  CachingAllocator a(std::make_unique<FakeBackend>(1 << 20, &live),
                     CachingAllocator::Mode::kExact);
  absl::StatusOr<void*> p = a.Allocate(13);
  REQUIRE(p.ok());
  CHECK(live == 13);  // not rounded to 512
  CHECK(a.stats().reserved_bytes == 13);
  REQUIRE(a.Free(*p).ok());
  CHECK(live == 0);  // back to the backend, not cached
  absl::StatusOr<void*> q = a.Allocate(13);
  REQUIRE(q.ok());
  CHECK(a.stats().num_cache_hits == 0);
  CHECK(a.stats().num_backend_allocs == 2);
  REQUIRE(a.Free(*q).ok());
}

// Events the test completes by hand: stand-ins for cudaEventRecord on another stream.
class StreamBackend : public FakeBackend {
 public:
  explicit StreamBackend(int64_t* live) : FakeBackend(int64_t{1} << 30, live) {}
  void* RecordEvent(void* stream) override {
    events_.push_back({stream, false});
    return reinterpret_cast<void*>(events_.size());  // 1-based id
  }
  bool EventDone(void* e) override { return events_[reinterpret_cast<size_t>(e) - 1].second; }
  void DestroyEvent(void*) override { ++destroyed_; }
  // Completes every event recorded on `stream` (its queued work finished).
  void Finish(void* stream) {
    for (auto& [s, done] : events_)
      if (s == stream) done = true;
  }
  int recorded() const { return static_cast<int>(events_.size()); }
  int destroyed_ = 0;

 private:
  std::vector<std::pair<void*, bool>> events_;
};

TEST_CASE("record stream: a block used on another stream is reused only after that stream's work") {
  int64_t live = 0;
  auto owned = std::make_unique<StreamBackend>(&live);
  StreamBackend* be = owned.get();
  CachingAllocator a(std::move(owned));
  void* compute = reinterpret_cast<void*>(0x100);
  void* comm = reinterpret_cast<void*>(0x200);  // e.g. the NCCL communicator's stream

  // One stream only: freed, then reused at once for the same stream.
  void* p = *a.Allocate(4096, compute);
  REQUIRE(a.Free(p).ok());
  CHECK(*a.Allocate(4096, compute) == p);
  REQUIRE(a.Free(p).ok());
  // Another stream does not get a block freed on `compute` (no order between the two).
  void* other = *a.Allocate(4096, comm);
  CHECK(other != p);
  REQUIRE(a.Free(other).ok());

  // The gradient is reduced on the communicator's stream, then freed on compute.
  void* g = *a.Allocate(4096, compute);
  CHECK(g == p);
  REQUIRE(a.RecordStream(g, comm).ok());
  REQUIRE(a.RecordStream(g, compute).ok());  // its own stream: nothing to record
  REQUIRE(a.Free(g).ok());
  CHECK(be->recorded() == 1);
  // While the reduction may still read it, a new request on compute gets other memory.
  void* q = *a.Allocate(4096, compute);
  CHECK(q != g);
  REQUIRE(a.Free(q).ok());
  be->Finish(comm);
  void* r1 = *a.Allocate(4096, compute);
  void* r2 = *a.Allocate(4096, compute);
  CHECK(((r1 == g) || (r2 == g)));  // back in the cache once the event completed
  CHECK(be->destroyed_ == 1);
  REQUIRE(a.Free(r1).ok());
  REQUIRE(a.Free(r2).ok());
  CHECK(a.stats().allocated_bytes == 0);
  CHECK_FALSE(a.RecordStream(g, comm).ok());  // not live any more
}

}  // namespace
}  // namespace ember::kernels::cuda

