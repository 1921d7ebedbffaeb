// libFuzzer target: the incremental TCPStore query parser (runtime/store/tcpstore_protocol.h), as
// TcpStoreServer feeds it a connection's bytes. Input: byte 0 picks the piece size (0 = the whole
// stream at once, else 1..255 bytes a Feed), the rest is the stream; the dialect comes from its
// first bytes like the server's. Checks beyond "no crash": the queries (and the error, if any) are
// the same whether the stream arrives whole or in pieces; no Feed consumes past its input or
// returns a query with more string bytes than the stream held; the strings of a query stay within
// the parser's query bound; held_bytes() (what the server charges to its budget) covers the
// strings' memory, is at most about twice the bytes of the query that arrived, and is 0 after
// Reset().
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/store/tcpstore_protocol.h"

namespace {

using ember::store::tcpstore::DetectDialect;
using ember::store::tcpstore::Dialect;
using ember::store::tcpstore::Query;
using ember::store::tcpstore::QueryParser;

constexpr uint64_t kQueryBound = 1 << 20;  // keeps one input's memory small

struct Parsed {
  std::vector<std::string> queries;  // op, type, num and strings, flattened
  bool error = false;
  size_t consumed = 0;  // of the stream, when it stopped
};

std::string Flatten(const Query& q) {
  std::string s;
  s.push_back(static_cast<char>(q.op));
  s.push_back(static_cast<char>(q.type));
  s.append(reinterpret_cast<const char*>(&q.num), sizeof(q.num));
  for (const std::string& x : q.strs) {
    const uint64_t n = x.size();
    s.append(reinterpret_cast<const char*>(&n), 8);
    s += x;
  }
  return s;
}

Parsed Parse(const char* data, size_t size, bool v2, size_t step) {
  QueryParser p(kQueryBound);
  Parsed out;
  size_t pos = 0;
  size_t query_start = 0;  // where the query in progress began in the stream
  // Each string costs the peer at least its 8-byte length: held_bytes() may add a std::string's
  // size for each, and twice the bytes that arrived.
  auto held_ok = [&p](size_t arrived) {
    uint64_t memory = 0;
    for (const std::string& x : p.query().strs) {
      memory += sizeof(std::string) + (x.capacity() > std::string().capacity() ? x.capacity() : 0);
    }
    return p.held_bytes() + std::string().capacity() * p.query().strs.size() >= memory &&
           p.held_bytes() <= 2 * arrived + (arrived / 8 + 1) * sizeof(std::string);
  };
  while (pos < size) {
    const size_t n = step == 0 ? size - pos : std::min(step, size - pos);
    size_t off = 0;
    while (off < n) {
      size_t used = 0;
      std::string err;
      const auto r = p.Feed(data + pos + off, n - off, v2, &used, &err);
      if (used > n - off) std::abort();
      off += used;
      if (r == QueryParser::Result::kError) {
        if (err.empty()) std::abort();
        out.error = true;
        out.consumed = pos + off;
        return out;
      }
      if (!held_ok(pos + off - query_start)) std::abort();
      if (r == QueryParser::Result::kNeedMore) {
        if (off != n) std::abort();  // kNeedMore takes everything it was given
        break;
      }
      uint64_t bytes = 0;
      for (const std::string& x : p.query().strs) bytes += x.size() + sizeof(std::string);
      if (bytes > kQueryBound || bytes - p.query().strs.size() * sizeof(std::string) > size) {
        std::abort();
      }
      out.queries.push_back(Flatten(p.query()));
      p.Reset();
      if (!p.AtBoundary() || p.held_bytes() != 0) std::abort();
      query_start = pos + off;
    }
    pos += n;
  }
  out.consumed = size;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* raw, size_t size) {
  if (size == 0) return 0;
  const size_t step = raw[0];
  const char* data = reinterpret_cast<const char*>(raw + 1);
  size--;
  const Dialect d = DetectDialect(data, size);
  if (size >= 5 && d == Dialect::kUnknown) std::abort();  // 5 bytes always decide
  const bool v2 = d == Dialect::kV2;
  const Parsed whole = Parse(data, size, v2, 0);
  if (step == 0) return 0;
  const Parsed pieces = Parse(data, size, v2, step);
  if (whole.queries != pieces.queries || whole.error != pieces.error ||
      whole.consumed != pieces.consumed) {
    std::abort();
  }
  return 0;
}
