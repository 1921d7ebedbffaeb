// Puts over TCP as the agent's own active messages (AgentOptions::put_over_am; UCX 1.13 has no RMA
// lane over TCP): two agents in one process with UCX_TLS=tcp. Multi-chunk puts at unaligned
// offsets and a two-element list arrive byte for byte, with the same result as UCX's emulated put
// (put_over_am = false); a put into a region the target deregistered after the sender imported it
// is refused by the target (its memory stays as it was), and the connection keeps working; a peer
// that imported one region cannot write into another with that region's token, nor into the region
// with a forged token (refused, counted in refused_puts(), the target's memory untouched).
// Gets there are requests answered by the target's agent (am_get.h): multi-chunk gets at odd
// offsets arrive byte for byte, as with UCX's emulated get; a get with another region's address,
// a wrong or zero token, or from a deregistered region fails with PERMISSION_DENIED / NOT_FOUND
// naming the address and length (counted in refused_gets(), nothing written into the getter's
// buffer); a get whose target goes away fails with UNAVAILABLE or CANCELLED, never hangs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/onesided/agent.h"
#include "runtime/onesided/agent_pair.h"
#include "runtime/onesided/descriptor.h"

namespace ember::onesided {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(20);

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 13 + seed * 5 + (i >> 11));
  return v;
}

std::unique_ptr<testing::AgentPair> TcpPair(bool put_over_am) {
  setenv("UCX_TLS", "tcp", 1);
  auto pair = testing::AgentPair::Create({.put_over_am = put_over_am});
  unsetenv("UCX_TLS");
  REQUIRE(pair.ok());
  return std::move(*pair);
}

// The index of the first byte where `got` differs from `want`, or -1 (a short failure message).
int64_t FirstDifference(const std::vector<char>& got, const std::vector<char>& want) {
  if (got.size() != want.size()) return static_cast<int64_t>(std::min(got.size(), want.size()));
  auto m = std::mismatch(got.begin(), got.end(), want.begin());
  return m.first == got.end() ? -1 : m.first - got.begin();
}

// Moves 2 MiB + 3 bytes (three 1 MiB messages) from offset 5 of a source region to offset 11 of a
// destination region, and 70001 bytes from the source's tail to 4001 bytes before the
// destination's end: a puts from its region into b's (and notifies), or a gets from b's region into
// its own. Returns the destination once complete, checked byte for byte.
std::vector<char> MoveAndRead(bool put, bool over_am) {
  auto p = TcpPair(over_am);
  const size_t kSrc = (3 << 20) + 77, kDst = (3 << 20) + 4096;
  std::vector<char> src = Pattern(kSrc, put ? 1 : 4), dst(kDst, 'z');
  auto rs = (put ? p->a : p->b)->RegisterMemory(src.data(), src.size());
  auto rd = (put ? p->b : p->a)->RegisterMemory(dst.data(), dst.size());
  REQUIRE(rs.ok());
  REQUIRE(rd.ok());
  auto remote = p->a_to_b->ImportRegion(put ? rd->descriptor : rs->descriptor);
  REQUIRE(remote.ok());
  const uint64_t n1 = (2 << 20) + 3, n2 = 70001;
  const uint64_t mine = put ? rs->id : rd->id;
  std::vector<LocalDesc> local = {{mine, 5, n1}, {mine, kSrc - n2, n2}};
  std::vector<RemoteDesc> theirs = {{*remote, 11, n1}, {*remote, kDst - 4001 - n2, n2}};
  if (!put) {
    local = {{mine, 11, n1}, {mine, kDst - 4001 - n2, n2}};
    theirs = {{*remote, 5, n1}, {*remote, kSrc - n2, n2}};
  }
  REQUIRE((put ? p->a->Put(p->a_to_b, local, theirs) : p->a->Get(p->a_to_b, local, theirs)).Wait(kTimeout).ok());
  if (put) {
    REQUIRE(p->a->Notify(p->a_to_b, "done").Wait(kTimeout).ok());
    auto note = p->b->WaitNotification(kTimeout);
    REQUIRE(note.ok());
    CHECK(note->message == "done");
  }
  std::vector<char> want(kDst, 'z');
  std::copy(src.begin() + 5, src.begin() + 5 + n1, want.begin() + 11);
  std::copy(src.end() - n2, src.end(), want.end() - 4001 - n2);
  CHECK(FirstDifference(dst, want) == -1);
  CHECK(p->b->refused_puts() + p->b->refused_gets() == 0);
  return dst;
}

TEST_CASE("puts over TCP as active messages land byte for byte, as UCX's emulated put does") {
  CHECK(MoveAndRead(/*put=*/true, /*over_am=*/true) == MoveAndRead(/*put=*/true, /*over_am=*/false));
}

TEST_CASE("a put into a region the target deregistered is refused there") {
  auto p = TcpPair(/*put_over_am=*/true);
  std::vector<char> src = Pattern(1 << 20, 2), gone(1 << 20, 'g'), live(4096, 'l');
  auto ls = p->a->RegisterMemory(src.data(), src.size());
  auto rg = p->b->RegisterMemory(gone.data(), gone.size());
  auto rl = p->b->RegisterMemory(live.data(), live.size());
  REQUIRE(ls.ok());
  REQUIRE(rg.ok());
  REQUIRE(rl.ok());
  auto remote_gone = p->a_to_b->ImportRegion(rg->descriptor);
  auto remote_live = p->a_to_b->ImportRegion(rl->descriptor);
  REQUIRE(remote_gone.ok());
  REQUIRE(remote_live.ok());
  REQUIRE(p->b->Deregister(rg->id).ok());  // the sender still holds the descriptor
  // The sender cannot tell: its Work completes; the target writes nothing.
  CHECK(p->a->Put(p->a_to_b, {{ls->id, 0, src.size()}}, {{*remote_gone, 0, src.size()}}).Wait(kTimeout).ok());
  // The connection still works: a later put into a live region lands, and after its notification
  // the refused one has certainly been handled (same connection, in order).
  REQUIRE(p->a->Put(p->a_to_b, {{ls->id, 100, 4096}}, {{*remote_live, 0, 4096}}).Wait(kTimeout).ok());
  REQUIRE(p->a->Notify(p->a_to_b, "after").Wait(kTimeout).ok());
  auto note = p->b->WaitNotification(kTimeout);
  REQUIRE(note.ok());
  CHECK(note->message == "after");
  CHECK(gone == std::vector<char>(1 << 20, 'g'));
  CHECK(std::equal(live.begin(), live.end(), src.begin() + 100));
  CHECK(p->b->refused_puts() == 1);
}

// `descriptor` with its base moved to `base` or its token replaced, as a peer that imported it
// could forge (the agent's API never does).
std::string Forge(const std::string& descriptor, uint64_t base, uint64_t token) {
  auto d = UnpackDescriptor(descriptor);
  REQUIRE(d.ok());
  d->base = base;
  d->token = token;
  return PackDescriptor(*d);
}

TEST_CASE("a put carries its region's token: another region's address or a wrong token is refused") {
  auto p = TcpPair(/*put_over_am=*/true);
  // A and B are both registered by b; a was given only A's descriptor. B lies right after A in one
  // allocation, and is larger, so A's length at B's address is inside B (the old check passed it).
  const size_t kA = (1 << 20) + 500, kB = 3 << 20;
  std::vector<char> src = Pattern(kA, 3), target(kA + kB, 't');
  char* a_base = target.data();
  char* b_base = target.data() + kA;
  auto ls = p->a->RegisterMemory(src.data(), src.size());
  auto ra = p->b->RegisterMemory(a_base, kA);
  auto rb = p->b->RegisterMemory(b_base, kB);
  REQUIRE(ls.ok());
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  auto da = UnpackDescriptor(ra->descriptor);
  auto db = UnpackDescriptor(rb->descriptor);
  REQUIRE(da.ok());
  REQUIRE(db.ok());
  REQUIRE(da->token != 0);
  REQUIRE(da->token != db->token);
  const uint64_t b_addr = reinterpret_cast<uint64_t>(b_base), a_addr = reinterpret_cast<uint64_t>(a_base);
  auto into_b = p->a_to_b->ImportRegion(Forge(ra->descriptor, b_addr + 4096, da->token));
  auto wrong_token = p->a_to_b->ImportRegion(Forge(ra->descriptor, a_addr, da->token ^ 1));
  auto guessed = p->a_to_b->ImportRegion(Forge(ra->descriptor, a_addr, 0));
  auto legit = p->a_to_b->ImportRegion(ra->descriptor);
  REQUIRE(into_b.ok());
  REQUIRE(wrong_token.ok());
  REQUIRE(guessed.ok());
  REQUIRE(legit.ok());
  const uint64_t before = p->b->refused_puts();
  // Each sender's Work completes (nothing answers an eager message); each chunk is refused.
  for (RemoteRegion r : {*into_b, *wrong_token, *guessed}) {
    CHECK(p->a->Put(p->a_to_b, {{ls->id, 0, kA}}, {{r, 0, kA}}).Wait(kTimeout).ok());
  }
  REQUIRE(p->a->Notify(p->a_to_b, "forged").Wait(kTimeout).ok());
  auto note = p->b->WaitNotification(kTimeout);  // after the puts before it were handled
  REQUIRE(note.ok());
  CHECK(note->message == "forged");
  const uint64_t chunks = (kA + kAmPutChunkBytes - 1) / kAmPutChunkBytes;
  CHECK(p->b->refused_puts() == before + 3 * chunks);
  CHECK(FirstDifference(target, std::vector<char>(kA + kB, 't')) == -1);  // neither A nor B written
  // The legitimate put, at an odd offset, still lands byte for byte, and only there.
  REQUIRE(p->a->Put(p->a_to_b, {{ls->id, 7, kA - 9}}, {{*legit, 2, kA - 9}}).Wait(kTimeout).ok());
  REQUIRE(p->a->Notify(p->a_to_b, "legit").Wait(kTimeout).ok());
  note = p->b->WaitNotification(kTimeout);
  REQUIRE(note.ok());
  CHECK(note->message == "legit");
  std::vector<char> want(kA + kB, 't');
  std::copy(src.begin() + 7, src.begin() + 7 + (kA - 9), want.begin() + 2);
  CHECK(FirstDifference(target, want) == -1);
  CHECK(p->b->refused_puts() == before + 3 * chunks);
}

TEST_CASE("gets over TCP as active messages arrive byte for byte, as UCX's emulated get does") {
  CHECK(MoveAndRead(/*put=*/false, /*over_am=*/true) == MoveAndRead(/*put=*/false, /*over_am=*/false));
}

TEST_CASE("a get carries its region's token: another region's address or a wrong token fails") {
  auto p = TcpPair(/*put_over_am=*/true);
  // b registers A and B (B right after A, larger); a was given only A's descriptor.
  const size_t kA = (1 << 20) + 500, kB = 3 << 20;
  std::vector<char> target = Pattern(kA + kB, 5), dst(kA, 'd');
  char* a_base = target.data();
  char* b_base = target.data() + kA;
  auto ld = p->a->RegisterMemory(dst.data(), dst.size());
  auto ra = p->b->RegisterMemory(a_base, kA);
  auto rb = p->b->RegisterMemory(b_base, kB);
  auto gone_buf = Pattern(4096, 6);
  auto rg = p->b->RegisterMemory(gone_buf.data(), gone_buf.size());
  REQUIRE(ld.ok());
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  REQUIRE(rg.ok());
  auto da = UnpackDescriptor(ra->descriptor);
  REQUIRE(da.ok());
  const uint64_t b_addr = reinterpret_cast<uint64_t>(b_base), a_addr = reinterpret_cast<uint64_t>(a_base);
  auto into_b = p->a_to_b->ImportRegion(Forge(ra->descriptor, b_addr + 4096, da->token));
  auto wrong_token = p->a_to_b->ImportRegion(Forge(ra->descriptor, a_addr, da->token ^ 1));
  auto guessed = p->a_to_b->ImportRegion(Forge(ra->descriptor, a_addr, 0));
  auto gone = p->a_to_b->ImportRegion(rg->descriptor);
  auto legit = p->a_to_b->ImportRegion(ra->descriptor);
  REQUIRE(into_b.ok());
  REQUIRE(wrong_token.ok());
  REQUIRE(guessed.ok());
  REQUIRE(gone.ok());
  REQUIRE(legit.ok());
  REQUIRE(p->b->Deregister(rg->id).ok());  // a still holds its descriptor
  const uint64_t before = p->b->refused_gets();
  struct Case {
    RemoteRegion region;
    uint64_t length;
    absl::StatusCode code;
    uint64_t address;
  };
  const uint64_t gone_addr = reinterpret_cast<uint64_t>(gone_buf.data());
  for (const Case& c : {Case{*into_b, kA, absl::StatusCode::kPermissionDenied, b_addr + 4096},
                        Case{*wrong_token, kA, absl::StatusCode::kNotFound, a_addr},
                        Case{*guessed, kA, absl::StatusCode::kNotFound, a_addr},
                        Case{*gone, 4096, absl::StatusCode::kNotFound, gone_addr}}) {
    absl::Status st = p->a->Get(p->a_to_b, {{ld->id, 0, c.length}}, {{c.region, 0, c.length}}).Wait(kTimeout);
    INFO(st.ToString());
    CHECK(st.code() == c.code);
    const std::string named = absl::StrCat("get of ", c.length, " bytes at 0x", absl::Hex(c.address));
    CHECK(absl::StrContains(st.message(), named));
    CHECK(absl::StrContains(st.message(), "refused by b"));
  }
  CHECK(p->b->refused_gets() == before + 4);
  CHECK(FirstDifference(dst, std::vector<char>(kA, 'd')) == -1);  // nothing leaked into a's buffer
  CHECK(p->b->refused_puts() == 0);
  // The legitimate get, at odd offsets, still lands byte for byte, and only there.
  REQUIRE(p->a->Get(p->a_to_b, {{ld->id, 7, kA - 9}}, {{*legit, 2, kA - 9}}).Wait(kTimeout).ok());
  std::vector<char> want(kA, 'd');
  std::copy(target.begin() + 2, target.begin() + 2 + (kA - 9), want.begin() + 7);
  CHECK(FirstDifference(dst, want) == -1);
  CHECK(p->b->refused_gets() == before + 4);
}

TEST_CASE("a get whose target goes away ends with an error, not a hang") {
  auto p = TcpPair(/*put_over_am=*/true);
  const size_t kN = 64 << 20;
  std::vector<char> src(kN, 's'), dst(kN, 'd');
  auto rs = p->b->RegisterMemory(src.data(), src.size());
  auto ld = p->a->RegisterMemory(dst.data(), dst.size());
  REQUIRE(rs.ok());
  REQUIRE(ld.ok());
  auto remote = p->a_to_b->ImportRegion(rs->descriptor);
  REQUIRE(remote.ok());
  // In flight when b closes its endpoints (64 replies of 1 MiB), or already answered: either way
  // the Work ends well within the timeout, and OK only with every byte.
  Work w = p->a->Get(p->a_to_b, {{ld->id, 0, kN}}, {{*remote, 0, kN}});
  p->b.reset();
  absl::Status st = w.Wait(kTimeout);
  INFO(st.ToString());
  CHECK((st.ok() || st.code() == absl::StatusCode::kUnavailable));
  if (st.ok()) CHECK(dst == src);
  // Later gets to the gone peer fail too (UNAVAILABLE), never hang.
  st = p->a->Get(p->a_to_b, {{ld->id, 0, 4096}}, {{*remote, 0, 4096}}).Wait(kTimeout);
  INFO(st.ToString());
  CHECK(st.code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ember::onesided
