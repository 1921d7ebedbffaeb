// CPU tests of the caching allocator's bookkeeping (allocator.h) over a counting fake backend.
#include "kernels/cuda/allocator.h"

#include <cstdlib>
#include <map>

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

}  // namespace
}  // namespace ember::kernels::cuda
