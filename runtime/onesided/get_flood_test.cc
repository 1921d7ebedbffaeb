// A peer flooding gets over TCP (gets as active messages, am_transfer.h) against a target with a
// small limit on reply bytes in flight (AgentOptions::max_get_reply_bytes_in_flight = 2 MiB) and on
// waiting requests (max_queued_gets = 4): every admitted get arrives byte for byte, the others fail
// with RESOURCE_EXHAUSTED naming the limit
// (nothing written into their part of the getter's buffer; counted in refused_gets()), and the
// target never had more than the limit of reply bytes in flight to the peer. The connection keeps
// working afterwards. A get waiting there whose region is deregistered meanwhile is refused
// (NOT_FOUND), not read: the target holds its replies (HoldGetRepliesForTest) until the region is
// gone, so that order is forced, not hoped for. (The target serves its FIFO in order, but UCX may deliver replies of
// consecutive gets out of order over TCP, seen here: a 1 MiB reply posted first arrived after the
// next get's, so the getter's completion order is not checked.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "runtime/onesided/agent.h"
#include "runtime/onesided/agent_pair.h"

namespace ember::onesided {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(30);

TEST_CASE("a flood of gets is bounded per peer: admitted ones byte for byte, the rest RESOURCE_EXHAUSTED") {
  constexpr uint64_t kCap = 2 << 20;
  constexpr int kQueue = 4, kGets = 32;
  constexpr uint64_t kLen = (2 << 20) + 3001, kStep = 4099;  // 3 reply chunks per get
  setenv("UCX_TLS", "tcp", 1);
  auto pair = testing::AgentPair::Create({.max_get_reply_bytes_in_flight = kCap, .max_queued_gets = kQueue});
  unsetenv("UCX_TLS");
  REQUIRE(pair.ok());
  auto& p = *pair;
  std::vector<char> src(kLen + kGets * kStep);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 29 + (i >> 9) + 3);
  std::vector<char> dst(kGets * kLen, 'z');
  auto rs = p->b->RegisterMemory(src.data(), src.size());
  auto rd = p->a->RegisterMemory(dst.data(), dst.size());
  REQUIRE(rs.ok());
  REQUIRE(rd.ok());
  auto remote = p->a_to_b->ImportRegion(rs->descriptor);
  REQUIRE(remote.ok());
  const uint64_t refused_before = p->b->refused_gets();

  // Get i reads [i * kStep, +kLen) of b's region into slice i of a's buffer; all posted at once.
  std::vector<Work> works;
  for (int i = 0; i < kGets; ++i) {
    works.push_back(p->a->Get(p->a_to_b, {{rd->id, i * kLen, kLen}}, {{*remote, i * kStep, kLen}}));
  }
  int admitted = 0, refused = 0;
  for (int i = 0; i < kGets; ++i) {
    const absl::Status st = works[i].Wait(kTimeout);
    INFO("get " << i << ": " << st.ToString());
    const std::vector<char> got(dst.begin() + i * kLen, dst.begin() + (i + 1) * kLen);
    if (st.ok()) {
      ++admitted;
      CHECK(std::equal(got.begin(), got.end(), src.begin() + i * kStep));
    } else {
      ++refused;
      CHECK(st.code() == absl::StatusCode::kResourceExhausted);
      CHECK(absl::StrContains(st.message(), "full (4 requests, AgentOptions.max_queued_gets"));
      CHECK(std::all_of(got.begin(), got.end(), [](char c) { return c == 'z'; }));
    }
  }
  INFO(admitted << " admitted, " << refused << " refused");
  CHECK(admitted >= 1);  // the first always is
  CHECK(refused >= 1);   // 32 requests arrive long before 3 MiB replies to 5 of them are sent
  CHECK(admitted + refused == kGets);
  CHECK(p->b->refused_gets() == refused_before + static_cast<uint64_t>(refused));
  CHECK(p->b->peak_get_reply_bytes() > 0);
  CHECK(p->b->peak_get_reply_bytes() <= kCap);

  // The connection still serves a get, byte for byte.
  std::fill(dst.begin(), dst.begin() + kLen, 'z');
  REQUIRE(p->a->Get(p->a_to_b, {{rd->id, 0, kLen}}, {{*remote, 5, kLen}}).Wait(kTimeout).ok());
  CHECK(std::equal(dst.begin(), dst.begin() + kLen, src.begin() + 5));
}

TEST_CASE("a get waiting in the target's queue is refused if its region is deregistered meanwhile") {
  setenv("UCX_TLS", "tcp", 1);
  auto pair = testing::AgentPair::Create({.max_get_reply_bytes_in_flight = 1 << 20, .max_queued_gets = 16});
  unsetenv("UCX_TLS");
  REQUIRE(pair.ok());
  auto& p = *pair;
  // b holds its replies back (HoldGetRepliesForTest), so the order is forced: 4 gets of `small` and
  // one of `kept` pass b's first check and wait in its queue; then `small` is deregistered; then b
  // serves the queue. Its re-check must refuse the 4 (the bytes are still in memory, so a server
  // without the re-check would send them and they would succeed), and serve `kept` byte for byte.
  constexpr uint64_t kSmall = 8192, kKept = 3 << 20;  // kept: 3 reply chunks
  constexpr int kRefusedGets = 4;
  std::vector<char> small(kSmall), kept(kKept), dst(kKept + kRefusedGets * kSmall, 'z');
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<char>(i * 7 + 1);
  for (size_t i = 0; i < kept.size(); ++i) kept[i] = static_cast<char>(i * 13 + (i >> 11) + 5);
  auto rs = p->b->RegisterMemory(small.data(), small.size());
  auto rk = p->b->RegisterMemory(kept.data(), kept.size());
  auto rd = p->a->RegisterMemory(dst.data(), dst.size());
  REQUIRE(rs.ok());
  REQUIRE(rk.ok());
  REQUIRE(rd.ok());
  auto remote_small = p->a_to_b->ImportRegion(rs->descriptor);
  auto remote_kept = p->a_to_b->ImportRegion(rk->descriptor);
  REQUIRE(remote_small.ok());
  REQUIRE(remote_kept.ok());
  const uint64_t refused_before = p->b->refused_gets();

  p->b->HoldGetRepliesForTest(true);
  std::vector<Work> waiting;
  for (int i = 0; i < kRefusedGets; ++i) {
    waiting.push_back(p->a->Get(p->a_to_b, {{rd->id, kKept + i * kSmall, kSmall}}, {{*remote_small, 0, kSmall}}));
  }
  Work kept_get = p->a->Get(p->a_to_b, {{rd->id, 0, kKept}}, {{*remote_kept, 0, kKept}});
  const absl::Time deadline = absl::Now() + kTimeout;
  while (p->b->WaitingGetsForTest() < kRefusedGets + 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  REQUIRE(p->b->WaitingGetsForTest() == kRefusedGets + 1);  // all passed the first check
  for (const Work& w : waiting) CHECK_FALSE(w.Done());       // held: nothing answered yet
  REQUIRE(p->b->Deregister(rs->id).ok());
  p->b->HoldGetRepliesForTest(false);

  for (int i = 0; i < kRefusedGets; ++i) {
    const absl::Status st = waiting[i].Wait(kTimeout);
    INFO("get " << i << " of the deregistered region: " << st.ToString());
    CHECK(st.code() == absl::StatusCode::kNotFound);
    CHECK(absl::StrContains(st.message(), "deregistered since"));
    const auto slice = dst.begin() + kKept + i * kSmall;
    CHECK(std::all_of(slice, slice + kSmall, [](char c) { return c == 'z'; }));
  }
  REQUIRE(kept_get.Wait(kTimeout).ok());
  CHECK(std::equal(dst.begin(), dst.begin() + kKept, kept.begin()));
  CHECK(p->b->refused_gets() == refused_before + kRefusedGets);
  CHECK(p->b->WaitingGetsForTest() == 0);
  CHECK(p->b->peak_get_reply_bytes() <= (1 << 20));
}

}  // namespace
}  // namespace ember::onesided
