// The TCPStore query parser against hand-built wire bytes (c10d tcputil's format): whole queries,
// the same bytes split at every position, several queries in one buffer, and the bounds.
#include "runtime/store/tcpstore_protocol.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ember::store::tcpstore {
namespace {

struct Bytes {
  std::string s;
  Bytes& U8(uint8_t v) { s.push_back(static_cast<char>(v)); return *this; }
  Bytes& U32(uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); return *this; }
  Bytes& U64(uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); return *this; }
  Bytes& Str(const std::string& v) { U64(v.size()); s += v; return *this; }
};

// Parses every query in `wire`, fed in pieces of `step` bytes.
std::vector<Query> ParseAll(const std::string& wire, bool v2, size_t step) {
  QueryParser p;
  std::vector<Query> out;
  size_t pos = 0;
  while (pos < wire.size()) {
    const size_t n = std::min(step, wire.size() - pos);
    size_t off = 0;
    while (off < n) {
      size_t used = 0;
      std::string err;
      const auto r = p.Feed(wire.data() + pos + off, n - off, v2, &used, &err);
      REQUIRE(r != QueryParser::Result::kError);
      off += used;
      if (r == QueryParser::Result::kNeedMore) {
        REQUIRE(off == n);
        break;
      }
      out.push_back(p.query());
      p.Reset();
    }
    pos += n;
  }
  CHECK(p.AtBoundary());
  return out;
}

TEST_CASE("every supported query, whole and split at every byte") {
  const std::string big(70000, 'v');
  Bytes b;
  b.U8(0).U32(kValidationMagic)                               // VALIDATE
      .U8(13).U32(77)                                         // PING
      .U8(1).Str("/k").Str(big)                               // SET
      .U8(2).Str("/k").Str("").Str("new")                     // COMPARE_SET
      .U8(3).Str("/k")                                        // GET
      .U8(4).Str("/n").U64(static_cast<uint64_t>(int64_t{-3}))  // ADD
      .U8(6).U64(2).Str("/a").Str("/b")                       // WAIT
      .U8(7)                                                  // GETNUMKEYS
      .U8(11).U64(2).Str("/x").Str("1").Str("/y").Str("2")    // MULTI_SET
      .U8(10).U64(0)                                          // MULTI_GET of nothing
      .U8(12);                                                // CANCEL_WAIT
  for (size_t step : {b.s.size(), size_t{1}, size_t{7}, size_t{4096}}) {
    INFO("step " << step);
    std::vector<Query> q = ParseAll(b.s, /*v2=*/true, step);
    REQUIRE(q.size() == 11);
    CHECK(q[0].op == Op::kValidate);
    CHECK(q[0].num == kValidationMagic);
    CHECK(q[1].op == Op::kPing);
    CHECK(q[1].num == 77);
    CHECK(q[2].op == Op::kSet);
    CHECK(q[2].strs == std::vector<std::string>{"/k", big});
    CHECK(q[3].op == Op::kCompareSet);
    CHECK(q[3].strs == std::vector<std::string>{"/k", "", "new"});
    CHECK(q[4].op == Op::kGet);
    CHECK(q[5].op == Op::kAdd);
    CHECK(static_cast<int64_t>(q[5].num) == -3);
    CHECK(q[6].op == Op::kWait);
    CHECK(q[6].strs == std::vector<std::string>{"/a", "/b"});
    CHECK(q[7].op == Op::kNumKeys);
    CHECK(q[8].op == Op::kMultiSet);
    CHECK(q[8].strs == std::vector<std::string>{"/x", "1", "/y", "2"});
    CHECK(q[9].op == Op::kMultiGet);
    CHECK(q[9].strs.empty());
    CHECK(q[10].op == Op::kCancelWait);
  }
}

TEST_CASE("1.13 numbering") {
  Bytes b;
  b.U8(0).Str("/a").Str("1").U8(2).Str("/a").U8(3).Str("/n").U64(5).U8(4).U64(1).Str("/a")
      .U8(6).U8(8).Str("/a");
  std::vector<Query> q = ParseAll(b.s, /*v2=*/false, 3);
  REQUIRE(q.size() == 6);
  CHECK(q[0].op == Op::kSet);
  CHECK(q[1].op == Op::kGet);
  CHECK(q[2].op == Op::kAdd);
  CHECK(q[2].num == 5);
  CHECK(q[3].op == Op::kCheck);
  CHECK(q[4].op == Op::kNumKeys);
  CHECK(q[5].op == Op::kDelete);
}

QueryParser::Result FeedOnce(const std::string& wire, bool v2, std::string* err,
                             uint64_t max_query_bytes = kMaxTcpStoreQueryBytes) {
  QueryParser p(max_query_bytes);
  size_t used = 0;
  return p.Feed(wire.data(), wire.size(), v2, &used, err);
}

TEST_CASE("bounds and unsupported queries are errors naming what was wrong") {
  std::string err;
  Bytes ok_len;
  ok_len.U8(0).Str("/k").U64(kMaxTcpStoreBytes);  // a 1 GiB value promised: fine, wait for it
  CHECK(FeedOnce(ok_len.s, false, &err) == QueryParser::Result::kNeedMore);
  Bytes over;
  over.U8(0).Str("/k").U64(kMaxTcpStoreBytes + 1);
  CHECK(FeedOnce(over.s, false, &err) == QueryParser::Result::kError);
  CHECK_THAT(err, Catch::Contains("1073741825"));
  // The query bound (1 GiB + 1 MiB), lowered to 200 bytes: each string is charged its length
  // and the size of a std::string, so two strings of 60 bytes pass and a third does not.
  Bytes three;
  three.U8(2).Str(std::string(60, 'a')).Str(std::string(60, 'b')).U64(60);
  CHECK(FeedOnce(three.s, true, &err, 200) == QueryParser::Result::kError);
  CHECK_THAT(err, Catch::Contains("200 per query"));
  Bytes two;
  two.U8(2).Str(std::string(60, 'a')).U64(60);
  CHECK(FeedOnce(two.s, true, &err, 200) == QueryParser::Result::kNeedMore);
  Bytes many;
  many.U8(4).U64(kMaxTcpStoreBytes + 1);
  CHECK(FeedOnce(many.s, false, &err) == QueryParser::Result::kError);
  CHECK(FeedOnce(std::string(1, '\x07'), false, &err) == QueryParser::Result::kError);  // WATCH_KEY
  CHECK_THAT(err, Catch::Contains("watch_key"));
  CHECK(FeedOnce(std::string(1, '\x0e'), true, &err) == QueryParser::Result::kError);  // QUEUE_PUSH
  CHECK_THAT(err, Catch::Contains("query type 14"));
}

// A key count costs the peer 8 bytes per key (an empty key) and the parser a std::string each,
// then the store request another: a count of millions would turn a few MB of wire into GBs. It is
// refused at the count, above the store's own default of 100,000 keys a request.
TEST_CASE("a multi-key query's count is bounded before any key arrives") {
  std::string err;
  for (uint8_t type : {uint8_t{6}, uint8_t{10}, uint8_t{11}}) {  // 2.x WAIT, MULTI_GET, MULTI_SET
    INFO("type " << int(type));
    Bytes at;
    at.U8(type).U64(131072);
    CHECK(FeedOnce(at.s, true, &err) == QueryParser::Result::kNeedMore);
    Bytes over;
    over.U8(type).U64(131073);
    CHECK(FeedOnce(over.s, true, &err) == QueryParser::Result::kError);
    CHECK_THAT(err, Catch::Contains("131073 keys"));
  }
}

// held_bytes() is what TcpStoreServer charges to its listener-wide budget: the memory of the bytes
// that arrived (a promised length costs nothing), and nothing after Reset().
TEST_CASE("held_bytes follows the bytes that arrived, not the length promised") {
  QueryParser p;
  Bytes head;
  head.U8(0).Str("/k").U64(uint64_t{64} << 20);  // 1.13 SET of a 64 MiB value
  size_t used = 0;
  std::string err;
  REQUIRE(p.Feed(head.s.data(), head.s.size(), false, &used, &err) ==
          QueryParser::Result::kNeedMore);
  CHECK(p.held_bytes() < 256);  // two std::strings, no value memory
  const std::string chunk(64 << 10, 'v');
  uint64_t arrived = 0;
  for (int i = 0; i < 40; ++i) {
    REQUIRE(p.Feed(chunk.data(), chunk.size(), false, &used, &err) ==
            QueryParser::Result::kNeedMore);
    arrived += chunk.size();
    CHECK(p.held_bytes() >= arrived);
    CHECK(p.held_bytes() <= 2 * arrived + 256);
  }
  CHECK(!p.AtBoundary());
  // The last bytes: the value's memory ends at its length (doubling stops there).
  const std::string rest((uint64_t{64} << 20) - arrived, 'w');
  REQUIRE(p.Feed(rest.data(), rest.size(), false, &used, &err) == QueryParser::Result::kQuery);
  CHECK(p.query().strs[1].capacity() == (size_t{64} << 20));
  CHECK(p.held_bytes() <= (uint64_t{64} << 20) + 256);
  p.Reset();
  CHECK(p.held_bytes() == 0);
}

TEST_CASE("the first bytes tell the dialect") {
  Bytes v2;
  v2.U8(0).U32(kValidationMagic);
  CHECK(DetectDialect(v2.s.data(), 0) == Dialect::kUnknown);
  CHECK(DetectDialect(v2.s.data(), 4) == Dialect::kUnknown);
  CHECK(DetectDialect(v2.s.data(), 5) == Dialect::kV2);
  Bytes set;
  set.U8(0).Str("/k");
  CHECK(DetectDialect(set.s.data(), set.s.size()) == Dialect::kV1);
  Bytes add;
  add.U8(3);
  CHECK(DetectDialect(add.s.data(), 1) == Dialect::kV1);
}

}  // namespace
}  // namespace ember::store::tcpstore
