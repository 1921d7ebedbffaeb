// TCPStore wire protocol pieces used by TcpStoreServer (tcpstore_server.h): the query numbering of
// torch 1.13 and 2.x, and an incremental parser that turns the bytes a connection received so far
// into whole queries. Wire format (c10d tcputil, both versions): a query is one byte of QueryType,
// then its arguments; a string or byte vector is a u64 (host order = little-endian) length then
// the bytes; integers are raw little-endian (8 bytes; 2.x's validation magic and ping nonce 4).
//
// Bounds (TCPStore clients do not authenticate): a string is at most kMaxTcpStoreBytes, a
// multi-key query's count at most kMaxTcpStoreKeys (refused at the count: an empty key costs the
// peer 8 bytes and the server a std::string, twice), and a query's strings together (each also charged the size of its
// std::string) at most kMaxTcpStoreQueryBytes. The parser holds only the bytes that arrived: a
// length that promises 1 GiB costs nothing until the bytes come; held_bytes() says what it holds
// (TcpStoreServer charges it to its listener-wide budget).
//
// Thread-safety: none (one parser per connection, used by one thread).
#ifndef EMBER_RUNTIME_STORE_TCPSTORE_PROTOCOL_H_
#define EMBER_RUNTIME_STORE_TCPSTORE_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ember::store::tcpstore {

// What a query asks, whichever protocol numbered it.
enum class Op {
  kValidate, kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kWatchKey, kDelete, kAppend,
  kMultiGet, kMultiSet, kCancelWait, kPing, kUnknown
};

Op FromV1(uint8_t type);  // torch 1.13's QueryType
Op FromV2(uint8_t type);  // torch 2.x's QueryType

constexpr uint32_t kValidationMagic = 0x3C85F7CE;  // c10d::detail::validationMagicNumber (2.x)
constexpr uint8_t kV2CancelWait = 12;
constexpr uint8_t kCheckReady = 0, kCheckNotReady = 1;  // CheckResponseType
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;  // WaitResponseType (WAIT_CANCELED: 2.x)
constexpr uint64_t kMaxTcpStoreBytes = uint64_t{1} << 30;  // larger lengths are garbage: close
// Above the store's default max_keys_per_request (100,000), which answers a larger request
// RESOURCE_EXHAUSTED; a store configured for more still gets at most this many through TCPStore.
constexpr uint64_t kMaxTcpStoreKeys = uint64_t{1} << 17;
constexpr uint64_t kMaxTcpStoreQueryBytes = kMaxTcpStoreBytes + (uint64_t{1} << 20);

// One parsed query: `strs` holds its keys and values in wire order (MULTI_SET: k1 v1 k2 v2 ...);
// `num` its integer (ADD's delta as two's complement, VALIDATE's magic, PING's nonce).
struct Query {
  Op op = Op::kUnknown;
  uint8_t type = 0;  // the wire byte
  std::vector<std::string> strs;
  uint64_t num = 0;
};

// The first bytes of a connection tell the protocol: a 2.x client opens with VALIDATE (0) and
// the magic number; a 1.13 client's first query never is that (a 1.13 SET of a key whose length
// starts with the magic would be a 1 GB key). kUnknown = too few bytes yet.
enum class Dialect { kUnknown, kV1, kV2 };
Dialect DetectDialect(const char* data, size_t n);

class QueryParser {
 public:
  enum class Result { kNeedMore, kQuery, kError };
  // `max_query_bytes`: the bound on one query's strings (tests lower it).
  explicit QueryParser(uint64_t max_query_bytes = kMaxTcpStoreQueryBytes)
      : max_query_bytes_(max_query_bytes) {}

  // Consumes bytes from data[0, n) into the query in progress and sets *consumed. kQuery: query()
  // is complete (the bytes after it are not consumed); take it, then Reset(). kError: *error says
  // what was wrong (unsupported type, a length over the bounds); the connection must close.
  Result Feed(const char* data, size_t n, bool v2, size_t* consumed, std::string* error);
  Query& query() { return q_; }
  void Reset();
  // True between queries (nothing of the next one consumed yet).
  bool AtBoundary() const { return stage_ == Stage::kType; }
  // Memory the query in progress holds: each string's capacity plus sizeof(std::string). Grows
  // only with bytes that arrived (at most about twice them); 0 after Reset().
  uint64_t held_bytes() const { return held_; }

 private:
  enum class Stage { kType, kCount, kLength, kBytes, kInt, kDone };
  // Copies up to `want` - have_ bytes into scratch_; true once it holds `want`.
  bool Fill(const char*& p, const char* end, size_t want);
  Stage NextAfterStrings() const { return int_bytes_ > 0 ? Stage::kInt : Stage::kDone; }

  const uint64_t max_query_bytes_;
  Query q_;
  Stage stage_ = Stage::kType;
  uint64_t strs_left_ = 0;   // strings still to come
  uint64_t str_left_ = 0;    // bytes of the current string still to come
  uint64_t charged_ = 0;     // bytes of this query counted against kMaxTcpStoreQueryBytes
  uint64_t held_ = 0;        // held_bytes()
  uint8_t per_count_ = 0;    // strings per counted item (0: no count field)
  uint8_t int_bytes_ = 0;    // size of the trailing integer (0, 4 or 8)
  char scratch_[8];
  size_t have_ = 0;          // bytes in scratch_
};

}  // namespace ember::store::tcpstore

#endif  // EMBER_RUNTIME_STORE_TCPSTORE_PROTOCOL_H_
