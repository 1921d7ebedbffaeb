#include "runtime/store/tcpstore_protocol.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace ember::store::tcpstore {

// torch 1.13: torch/csrc/distributed/c10d/TCPStore.cpp, enum class QueryType : uint8_t
// (SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, WATCH_KEY, DELETE_KEY).
Op FromV1(uint8_t t) {
  static constexpr Op kOps[] = {Op::kSet,  Op::kCompareSet, Op::kGet,      Op::kAdd,   Op::kCheck,
                                Op::kWait, Op::kNumKeys,    Op::kWatchKey, Op::kDelete};
  return t < std::size(kOps) ? kOps[t] : Op::kUnknown;
}

// torch 2.x: torch/csrc/distributed/c10d/TCPStoreBackend.hpp, enum class QueryType : uint8_t as
// of pytorch/pytorch commit 0278b21833d7 (VALIDATE .. CANCEL_WAIT) and tag v2.8.0-rc4 (adds PING,
// QUEUE_PUSH, QUEUE_POP, QUEUE_LEN); client side: TCPStore.cpp of the same releases (validate(),
// ping(), doWait(), multiGet(), multiSet()). The queue ops (14-16; the libuv server only) and
// anything newer are not served: the connection is closed naming the query type.
Op FromV2(uint8_t t) {
  static constexpr Op kOps[] = {
      Op::kValidate, Op::kSet,      Op::kCompareSet, Op::kGet,      Op::kAdd,
      Op::kCheck,    Op::kWait,     Op::kNumKeys,    Op::kDelete,   Op::kAppend,
      Op::kMultiGet, Op::kMultiSet, Op::kCancelWait, Op::kPing};
  return t < std::size(kOps) ? kOps[t] : Op::kUnknown;
}

Dialect DetectDialect(const char* data, size_t n) {
  if (n == 0) return Dialect::kUnknown;
  if (data[0] != 0) return Dialect::kV1;
  if (n < 5) return Dialect::kUnknown;  // (both send >= 5 bytes first)
  uint32_t magic;
  std::memcpy(&magic, data + 1, 4);
  return magic == kValidationMagic ? Dialect::kV2 : Dialect::kV1;
}

namespace {

// The arguments of each query: `strs` strings, or (per_count > 0) a u64 count then count x
// per_count strings; then an integer of int_bytes.
struct Shape {
  uint8_t strs, per_count, int_bytes;
  bool supported;
};

Shape ShapeOf(Op op) {
  switch (op) {
    case Op::kValidate:
    case Op::kPing: return {0, 0, 4, true};
    case Op::kCancelWait:
    case Op::kNumKeys: return {0, 0, 0, true};
    case Op::kSet:
    case Op::kAppend: return {2, 0, 0, true};
    case Op::kCompareSet: return {3, 0, 0, true};
    case Op::kGet:
    case Op::kDelete: return {1, 0, 0, true};
    case Op::kAdd: return {1, 0, 8, true};
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet: return {0, 1, 0, true};
    case Op::kMultiSet: return {0, 2, 0, true};
    case Op::kWatchKey:
    case Op::kUnknown: break;
  }
  return {0, 0, 0, false};
}

}  // namespace

void QueryParser::Reset() {
  q_.op = Op::kUnknown;
  q_.type = 0;
  q_.strs.clear();
  if (q_.strs.capacity() > 64) std::vector<std::string>().swap(q_.strs);  // after a multi-key query
  q_.num = 0;
  stage_ = Stage::kType;
  strs_left_ = str_left_ = charged_ = held_ = 0;
  per_count_ = int_bytes_ = 0;
  have_ = 0;
}

bool QueryParser::Fill(const char*& p, const char* end, size_t want) {
  const size_t take = std::min<size_t>(want - have_, static_cast<size_t>(end - p));
  std::memcpy(scratch_ + have_, p, take);
  have_ += take;
  p += take;
  if (have_ < want) return false;
  have_ = 0;
  return true;
}

QueryParser::Result QueryParser::Feed(const char* data, size_t n, bool v2, size_t* consumed,
                                      std::string* error) {
  const char* p = data;
  const char* const end = data + n;
  auto fail = [&](std::string why) {
    *consumed = static_cast<size_t>(p - data);
    *error = std::move(why);
    return Result::kError;
  };
  while (true) {
    switch (stage_) {
      case Stage::kType: {
        if (p == end) break;
        q_.type = static_cast<uint8_t>(*p++);
        q_.op = v2 ? FromV2(q_.type) : FromV1(q_.type);
        const Shape s = ShapeOf(q_.op);
        if (!s.supported) {
          if (q_.op == Op::kWatchKey) return fail("TCPStore watch_key is not supported by ember-store");
          return fail(absl::StrCat(
              "unsupported TCPStore query type ", static_cast<int>(q_.type), " from a torch ",
              v2 ? "2.x" : "1.13", " client (ember-store serves 1.13's queries 0-8 except "
              "WATCH_KEY and 2.x's 0-13: no QUEUE_PUSH/POP/LEN or newer)"));
        }
        strs_left_ = s.strs;
        per_count_ = s.per_count;
        int_bytes_ = s.int_bytes;
        stage_ = per_count_ > 0 ? Stage::kCount : strs_left_ > 0 ? Stage::kLength : NextAfterStrings();
        continue;
      }
      case Stage::kCount: {
        if (!Fill(p, end, 8)) break;
        uint64_t count;
        std::memcpy(&count, scratch_, 8);
        if (count > kMaxTcpStoreKeys) {
          return fail(absl::StrCat("TCPStore query of ", count, " keys: over the limit of ",
                                   kMaxTcpStoreKeys, " keys a query"));
        }
        strs_left_ = count * per_count_;
        stage_ = strs_left_ > 0 ? Stage::kLength : NextAfterStrings();
        continue;
      }
      case Stage::kLength: {
        if (!Fill(p, end, 8)) break;
        uint64_t len;
        std::memcpy(&len, scratch_, 8);
        charged_ += sizeof(std::string) + std::min(len, kMaxTcpStoreQueryBytes);
        if (len > kMaxTcpStoreBytes || charged_ > max_query_bytes_) {
          return fail(absl::StrCat("TCPStore string of ", len, " bytes (a query's strings: ",
                                   charged_, "): over the limit of ", kMaxTcpStoreBytes, " (",
                                   max_query_bytes_, " per query)"));
        }
        q_.strs.emplace_back();
        held_ += sizeof(std::string);
        str_left_ = len;
        --strs_left_;
        stage_ = Stage::kBytes;
        continue;
      }
      case Stage::kBytes: {
        // Grows with the bytes that really arrive: doubling (at most 2x them), but never past the
        // string's length (a fresh string reserves exactly; std::string's own growth would not).
        const size_t take = static_cast<size_t>(std::min<uint64_t>(str_left_, end - p));
        std::string& s = q_.strs.back();
        const size_t before = s.capacity();
        if (s.size() + take > before) {
          std::string grown;
          grown.reserve(static_cast<size_t>(std::min<uint64_t>(
              std::max(s.size() + take, 2 * before), s.size() + str_left_)));
          grown.append(s);
          s.swap(grown);
        }
        s.append(p, take);
        held_ += s.capacity() - before;
        p += take;
        str_left_ -= take;
        if (str_left_ > 0) break;
        stage_ = strs_left_ > 0 ? Stage::kLength : NextAfterStrings();
        continue;
      }
      case Stage::kInt: {
        if (!Fill(p, end, int_bytes_)) break;
        uint64_t v = 0;
        std::memcpy(&v, scratch_, int_bytes_);
        q_.num = v;
        stage_ = Stage::kDone;
        continue;
      }
      case Stage::kDone:
        *consumed = static_cast<size_t>(p - data);
        return Result::kQuery;
    }
    *consumed = static_cast<size_t>(p - data);
    return Result::kNeedMore;
  }
}

}  // namespace ember::store::tcpstore
