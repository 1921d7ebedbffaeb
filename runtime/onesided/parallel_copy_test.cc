// The copies of large transfers (parallel_copy.h): StreamingCopy against memcpy at every alignment;
// ParallelCopier against memcpy for segment sizes around its chunk size, with concurrent callers;
// and Put/Get between two agents whose peer regions are mapped (detect_peer_failure = false,
// AllocateMemory), at unaligned offsets and in descriptor lists, with the copy on two threads and on UCX's one, byte for byte.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/onesided/agent.h"
#include "runtime/onesided/agent_pair.h"
#include "runtime/onesided/parallel_copy.h"
#include "runtime/onesided/test_pattern.h"

namespace ember::onesided {
namespace {

using internal::ParallelCopier;
constexpr uint64_t kChunk = ParallelCopier::kChunkBytes;

TEST_CASE("ParallelCopier copies every segment exactly, also with concurrent callers") {
  ParallelCopier copier;
  // Sizes below, at and around the chunk size and the two-chunk threshold, and an empty segment.
  const std::vector<uint64_t> sizes = {0, 1, kChunk - 1, kChunk, kChunk + 1, 2 * kChunk + 3, 7 * kChunk + 5};
  auto run = [&](int tag) {
    uint64_t total = 0;
    for (uint64_t n : sizes) total += n + 2;  // a guard byte on each side
    std::vector<uint8_t> src(total), dst(total, 0xEE);
    FillPattern(src.data(), src.size(), 9, tag);
    std::vector<ParallelCopier::Segment> segs;
    uint64_t off = 0;
    for (uint64_t n : sizes) {
      segs.push_back({dst.data() + off + 1, src.data() + off + 1, n});
      off += n + 2;
    }
    copier.Copy(segs);
    off = 0;
    std::string why;
    for (uint64_t n : sizes) {
      if (dst[off] != 0xEE || dst[off + n + 1] != 0xEE) why = absl::StrCat("guard around ", n, " bytes");
      if (memcmp(dst.data() + off + 1, src.data() + off + 1, n) != 0) why = absl::StrCat("segment of ", n);
      off += n + 2;
    }
    return why;
  };
  CHECK(run(1) == "");
  std::vector<std::string> why(3);
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t) ts.emplace_back([&, t] { for (int k = 0; k < 4 && why[t].empty(); ++k) why[t] = run(10 + t); });
  for (auto& t : ts) t.join();
  for (const auto& w : why) CHECK(w == "");
}

TEST_CASE("StreamingCopy equals memcpy at every alignment, length and around its threshold") {
  constexpr uint64_t kMin = internal::kStreamingCopyMinBytes;
  const std::vector<uint64_t> lengths = {0, 1, 15, 63, 64, 65, kMin - 1, kMin, kMin + 1, kMin + 63, 3 * kMin + 17};
  std::vector<uint8_t> src(4 * kMin + 64);
  FillPattern(src.data(), src.size(), 3, 4);
  for (uint64_t n : lengths) {
    for (uint64_t dst_off : {0, 1, 8, 15}) {
      for (uint64_t src_off : {0, 3, 16}) {
        std::vector<uint8_t> dst(n + 32, 0xEE);
        internal::StreamingCopy(dst.data() + dst_off, src.data() + src_off, n);
        INFO("length " << n << ", destination offset " << dst_off << ", source offset " << src_off);
        REQUIRE(memcmp(dst.data() + dst_off, src.data() + src_off, n) == 0);
        for (uint64_t i = 0; i < dst_off; ++i) REQUIRE(dst[i] == 0xEE);
        for (uint64_t i = dst_off + n; i < dst.size(); ++i) REQUIRE(dst[i] == 0xEE);
      }
    }
  }
}

// Rank a puts a pattern into b's mapped region and gets b's pattern back, at odd offsets.
void PutGet(uint64_t parallel_min) {
  unsetenv("UCX_TLS");
  AgentOptions o;
  o.detect_peer_failure = false;
  o.parallel_copy_min_bytes = parallel_min;
  auto pair = testing::AgentPair::Create(o);
  REQUIRE(pair.ok());
  Agent* a = (*pair)->a.get();
  Agent* b = (*pair)->b.get();
  constexpr uint64_t kBytes = 12 << 20, kN = 9 * kChunk + 13;  // over the 4 MiB default threshold
  auto la = a->AllocateMemory(kBytes);
  auto rb = b->AllocateMemory(kBytes);
  REQUIRE(la.ok());
  REQUIRE(rb.ok());
  auto* pa = static_cast<uint8_t*>(la->base);
  auto* pb = static_cast<uint8_t*>(rb->base);
  auto remote = (*pair)->a_to_b->ImportRegion(rb->descriptor);
  REQUIRE(remote.ok());

  memset(pa, 0xEE, kBytes);
  memset(pb, 0xEE, kBytes);
  FillPattern(pa + 3, kN, 0, 1);
  REQUIRE(a->Put((*pair)->a_to_b, {{la->id, 3, kN}}, {{*remote, 5, kN}}).Wait(absl::Seconds(30)).ok());
  CHECK(CheckPattern(pb, kBytes, 5, kN, 0, 1) == "");

  memset(pa, 0xEE, kBytes);
  memset(pb, 0xEE, kBytes);
  FillPattern(pb + 7, kN, 1, 2);
  REQUIRE(a->Get((*pair)->a_to_b, {{la->id, 1, kN}}, {{*remote, 7, kN}}).Wait(absl::Seconds(30)).ok());
  CHECK(CheckPattern(pa, kBytes, 1, kN, 1, 2) == "");

  // A list: two pieces of b's pattern swapped into a's region, together over the threshold.
  memset(pa, 0xEE, kBytes);
  constexpr uint64_t kHalf = 5 * kChunk + 1;
  FillPattern(pb + 7, 2 * kHalf, 1, 2);
  REQUIRE(a->Get((*pair)->a_to_b, {{la->id, kHalf + 2, kHalf}, {la->id, 2, kHalf}},
                 {{*remote, 7, kHalf}, {*remote, 7 + kHalf, kHalf}})
              .Wait(absl::Seconds(30))
              .ok());
  std::vector<uint8_t> want(2 * kHalf);
  FillPattern(want.data(), want.size(), 1, 2);
  CHECK(memcmp(pa + kHalf + 2, want.data(), kHalf) == 0);
  CHECK(memcmp(pa + 2, want.data() + kHalf, kHalf) == 0);
  CHECK((pa[1] == 0xEE && pa[2 * kHalf + 2] == 0xEE));
}

TEST_CASE("put and get of mapped peer memory: two-thread copy and UCX's copy agree") {
  SECTION("two threads (default threshold)") { PutGet(AgentOptions{}.parallel_copy_min_bytes); }
  SECTION("UCX alone") { PutGet(0); }
}

}  // namespace
}  // namespace ember::onesided
