#include "kernels/tensor.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ember::kernels {
namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

// Freed blocks of kMinCached..kMaxBlock bytes are kept (up to kMaxCached bytes in all) and handed
// out again for the same rounded size: a training step allocates the same activation shapes
// every step, and fresh mmap'd blocks cost a page fault and a page clear per 4 KiB.
constexpr size_t kMinCached = size_t{1} << 20;
constexpr size_t kMaxBlock = size_t{256} << 20;
constexpr size_t kMaxCached = size_t{512} << 20;

struct BlockCache {
  std::mutex mu;
  std::multimap<size_t, void*> blocks;  // rounded size -> block
  size_t bytes = 0;
};

BlockCache& Cache() {
  static BlockCache* c = new BlockCache;  // never destroyed: frees may run during exit
  return *c;
}

size_t Rounded(size_t bytes) {
  size_t r = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return r == 0 ? kAlignment : r;
}
}  // namespace

void* AlignedAlloc(size_t bytes) {
  const size_t rounded = Rounded(bytes);
  void* p = nullptr;
  if (rounded >= kMinCached && rounded <= kMaxBlock) {
    BlockCache& c = Cache();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.blocks.find(rounded);
    if (it != c.blocks.end()) {
      p = it->second;
      c.blocks.erase(it);
      c.bytes -= rounded;
    }
  }
  if (p == nullptr) p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    std::fprintf(stderr, "AlignedAlloc: out of memory (%zu bytes)\n", bytes);
    std::abort();
  }
  int64_t live = g_live.fetch_add(bytes) + bytes;
  int64_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {}
  return p;
}

void AlignedFree(void* p, size_t bytes) {
  if (p == nullptr) return;
  g_live.fetch_sub(bytes);
  const size_t rounded = Rounded(bytes);
  if (rounded >= kMinCached && rounded <= kMaxBlock) {
    BlockCache& c = Cache();
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.bytes + rounded <= kMaxCached) {
      c.blocks.emplace(rounded, p);
      c.bytes += rounded;
      return;
    }
  }
  std::free(p);
}

void ReleaseCachedBlocks() {
  BlockCache& c = Cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [size, p] : c.blocks) std::free(p);
  c.blocks.clear();
  c.bytes = 0;
}

int64_t MemoryStats::live_bytes() { return g_live.load(); }
int64_t MemoryStats::peak_bytes() { return g_peak.load(); }
void MemoryStats::ResetPeak() { g_peak.store(g_live.load()); }

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

std::string Tensor::ShapeString() const {
  return absl::StrCat(DTypeName(dtype_), "[", absl::StrJoin(shape_, ","), "]");
}

Tensor Tensor::Empty(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  size_t bytes = t.nbytes();
  void* p = AlignedAlloc(bytes);
  t.storage_ = std::shared_ptr<void>(p, [bytes](void* q) { AlignedFree(q, bytes); });
  t.data_ = p;
  return t;
}

Tensor Tensor::Zeros(DType dtype, std::vector<int64_t> shape) {
  Tensor t = Empty(dtype, std::move(shape));
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::Borrow(void* data, DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  return t;
}

}  // namespace ember::kernels
