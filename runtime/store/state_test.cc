// The store's operations as pure functions (state.h), without a server: each test builds a state,
// applies requests and compares the response, the state and what the observer saw with results
// worked out by hand.
#include "runtime/store/state.h"

#include <catch2/catch.hpp>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/clock.h"

namespace ember::store {
namespace {

using v1::Request;
using v1::Response;

// Records every change as "put k=v@rev lease", "del k@rev", "grant id ttl@rev", "revoke id@rev".
class Recorder : public StateObserver {
 public:
  void OnPut(const std::string& key, const Entry& e) override {
    log.push_back(absl::StrCat("put ", key, "=", e.value, "@", e.revision, " lease ", e.lease));
  }
  void OnDelete(const std::string& key, int64_t revision) override {
    log.push_back(absl::StrCat("del ", key, "@", revision));
  }
  void OnLeaseGrant(int64_t id, int64_t ttl_ms, int64_t revision) override {
    log.push_back(absl::StrCat("grant ", id, " ", ttl_ms, "@", revision));
  }
  void OnLeaseRevoke(int64_t id, int64_t revision) override {
    log.push_back(absl::StrCat("revoke ", id, "@", revision));
  }
  std::vector<std::string> log;
};

struct World {
  World() { options.max_key_bytes = 16; options.max_value_bytes = 8; }
  ApplyContext ctx() { return ApplyContext{options, &clock, &rec}; }
  Response Run(const Request& req) {
    Response r;
    CHECK(Apply(state, ctx(), req, &r) == Applied::kAnswered);
    return r;
  }
  Response Set(const std::string& k, const std::string& v, int64_t lease = 0) {
    Request q;
    q.mutable_set()->set_key(k);
    q.mutable_set()->set_value(v);
    q.mutable_set()->set_lease_id(lease);
    return Run(q);
  }
  Response Add(const std::string& k, int64_t delta) {
    Request q;
    q.mutable_add()->set_key(k);
    q.mutable_add()->set_delta(delta);
    return Run(q);
  }
  std::string Value(const std::string& k) const {
    auto it = state.kv.find(k);
    return it == state.kv.end() ? "<absent>" : it->second.value;
  }
  absl::StatusCode Code(const Response& r) { return static_cast<absl::StatusCode>(r.code()); }

  BackendOptions options;
  base::FakeClock clock;
  Recorder rec;
  StoreState state;
};

TEST_CASE("Set stores the value, bumps the revision and tells the observer") {
  World w;
  Response r = w.Set("a", "1");
  CHECK(r.code() == 0);
  CHECK(r.set().revision() == 1);
  r = w.Set("b", "22");
  CHECK(r.set().revision() == 2);
  r = w.Set("a", "333");
  CHECK(r.set().revision() == 3);
  CHECK(w.Value("a") == "333");
  CHECK(w.state.kv.at("a").revision == 3);
  CHECK(w.state.kv.at("b").revision == 2);
  CHECK(w.rec.log == std::vector<std::string>{"put a=1@1 lease 0", "put b=22@2 lease 0",
                                               "put a=333@3 lease 0"});
}

TEST_CASE("Limits: a key or value over its limit and a key that is not UTF-8 change nothing") {
  World w;  // max_key_bytes 16, max_value_bytes 8
  Response r = w.Set(std::string(17, 'k'), "v");
  CHECK(w.Code(r) == absl::StatusCode::kInvalidArgument);
  CHECK(r.message().find("key of 17 bytes exceeds the limit max_key_bytes=16") !=
        std::string::npos);
  r = w.Set("k", "123456789");
  CHECK(w.Code(r) == absl::StatusCode::kInvalidArgument);
  CHECK(r.message().find("value of 9 bytes exceeds the limit max_value_bytes=8") !=
        std::string::npos);
  r = w.Set("bad\xff", "v");
  CHECK(w.Code(r) == absl::StatusCode::kInvalidArgument);
  CHECK(r.message().find("not valid UTF-8 at byte 3") != std::string::npos);
  CHECK(w.Set(std::string(16, 'k'), "12345678").code() == 0);  // exactly at both limits
  CHECK(w.state.revision == 1);
  CHECK(w.rec.log.size() == 1);
}

TEST_CASE("Add: a missing key counts as 0, the value is decimal text") {
  World w;
  Response r = w.Add("n", 5);
  CHECK(r.add().value() == 5);
  r = w.Add("n", -7);
  CHECK(r.add().value() == -2);
  CHECK(w.Value("n") == "-2");
  CHECK(w.state.revision == 2);
  r = w.Add("n", 0);  // a read through Add still writes (a new revision), like TCPStore
  CHECK(r.add().value() == -2);
  CHECK(w.state.revision == 3);
}

TEST_CASE("Add overflow is OUT_OF_RANGE and leaves the value and revision unchanged") {
  World w;
  w.options.max_value_bytes = 20;  // "-9223372036854775808" is 20 bytes
  const int64_t max = std::numeric_limits<int64_t>::max();
  REQUIRE(w.Set("n", absl::StrCat(max - 1)).code() == 0);
  CHECK(w.Add("n", 1).add().value() == max);
  Response r = w.Add("n", 1);
  CHECK(w.Code(r) == absl::StatusCode::kOutOfRange);
  CHECK(r.message().find("9223372036854775807 + 1 is outside the int64 range") !=
        std::string::npos);
  CHECK(w.Value("n") == "9223372036854775807");
  CHECK(w.state.revision == 2);
  REQUIRE(w.Set("m", absl::StrCat(std::numeric_limits<int64_t>::min())).code() == 0);
  CHECK(w.Code(w.Add("m", -1)) == absl::StatusCode::kOutOfRange);
  CHECK(w.Value("m") == "-9223372036854775808");
}

TEST_CASE("Add on a value that is not an int64 is INVALID_ARGUMENT, value unchanged") {
  World w;
  REQUIRE(w.Set("s", "abc").code() == 0);
  Response r = w.Add("s", 1);
  CHECK(w.Code(r) == absl::StatusCode::kInvalidArgument);
  CHECK(r.message().find("not a decimal int64 (3 bytes)") != std::string::npos);
  CHECK(w.Value("s") == "abc");
  CHECK(w.state.revision == 1);
}

Request CompareSet(const std::string& k, const std::string* expected, const std::string& desired) {
  Request q;
  auto* c = q.mutable_compare_set();
  c->set_key(k);
  c->set_expect_absent(expected == nullptr);
  if (expected != nullptr) c->set_expected(*expected);
  c->set_desired(desired);
  return q;
}

TEST_CASE("CompareSet swaps on a match and leaves the value on a mismatch") {
  World w;
  // Absent expected, key absent: swaps.
  Response r = w.Run(CompareSet("k", nullptr, "v1"));
  CHECK(r.compare_set().swapped());
  CHECK(r.compare_set().exists());
  CHECK(r.compare_set().current() == "v1");
  CHECK(w.state.revision == 1);
  // Absent expected, key present: no swap, reports the current value.
  r = w.Run(CompareSet("k", nullptr, "v2"));
  CHECK_FALSE(r.compare_set().swapped());
  CHECK(r.compare_set().exists());
  CHECK(r.compare_set().current() == "v1");
  // Expected value differs: no swap, value and revision unchanged.
  const std::string wrong = "nope";
  r = w.Run(CompareSet("k", &wrong, "v2"));
  CHECK_FALSE(r.compare_set().swapped());
  CHECK(r.compare_set().current() == "v1");
  CHECK(w.Value("k") == "v1");
  CHECK(w.state.revision == 1);
  // Expected value matches: swaps.
  const std::string v1 = "v1";
  r = w.Run(CompareSet("k", &v1, "v2"));
  CHECK(r.compare_set().swapped());
  CHECK(w.Value("k") == "v2");
  CHECK(w.state.revision == 2);
  // Expected a value on a missing key: no swap, exists = false, current empty.
  r = w.Run(CompareSet("missing", &v1, "x"));
  CHECK_FALSE(r.compare_set().swapped());
  CHECK_FALSE(r.compare_set().exists());
  CHECK(r.compare_set().current().empty());
  CHECK(w.Value("missing") == "<absent>");
}

TEST_CASE("Delete of a missing key answers deleted=false and changes no revision") {
  World w;
  Request del;
  del.mutable_delete_()->set_key("k");
  Response r = w.Run(del);
  CHECK(r.code() == 0);
  CHECK_FALSE(r.delete_().deleted());
  CHECK(w.state.revision == 0);
  CHECK(w.rec.log.empty());
  REQUIRE(w.Set("k", "v").code() == 0);
  r = w.Run(del);
  CHECK(r.delete_().deleted());
  CHECK(w.state.revision == 2);
  CHECK(w.rec.log.back() == "del k@2");
}

TEST_CASE("DeletePrefix, NumKeys and ListKeys see exactly the keys under the prefix") {
  World w;
  for (const char* k : {"a/1", "a/2", "a/3", "ab", "b/1"}) REQUIRE(w.Set(k, "v").code() == 0);
  Request n;
  n.mutable_num_keys()->set_prefix("a/");
  CHECK(w.Run(n).num_keys().count() == 3);
  n.mutable_num_keys()->set_prefix("");
  CHECK(w.Run(n).num_keys().count() == 5);
  Request l;
  l.mutable_list_keys()->set_prefix("a");
  Response r = w.Run(l);
  CHECK(std::vector<std::string>(r.list_keys().keys().begin(), r.list_keys().keys().end()) ==
        std::vector<std::string>{"a/1", "a/2", "a/3", "ab"});
  Request d;
  d.mutable_delete_prefix()->set_prefix("a/");
  CHECK(w.Run(d).delete_prefix().deleted() == 3);
  CHECK(w.state.kv.size() == 2);
  CHECK(w.state.revision == 8);  // 5 sets + 3 deletes
  CHECK(w.Run(d).delete_prefix().deleted() == 0);
}

TEST_CASE("ListKeys and MultiGet answers above max_response_bytes are RESOURCE_EXHAUSTED") {
  World w;
  w.options.max_response_bytes = 30;
  for (const char* k : {"k1", "k2", "k3"}) REQUIRE(w.Set(k, "12345678").code() == 0);
  Request l;
  l.mutable_list_keys()->set_prefix("k");
  CHECK(w.Run(l).list_keys().keys_size() == 3);  // 3 * (8 + 2) = 30 bytes: at the limit
  REQUIRE(w.Set("k4", "").code() == 0);
  Response r = w.Run(l);  // 4 * (8 + 2) = 40 bytes
  CHECK(w.Code(r) == absl::StatusCode::kResourceExhausted);
  CHECK(r.message().find("the answer for 4 keys would be 40 bytes") != std::string::npos);
  CHECK(r.list_keys().keys_size() == 0);
  Request m;
  m.mutable_multi_get()->add_keys("k1");
  CHECK(w.Run(m).multi_get().values(0) == "12345678");  // 8 + 8 = 16 bytes
  m.mutable_multi_get()->add_keys("k2");
  CHECK(w.Code(w.Run(m)) == absl::StatusCode::kResourceExhausted);  // 2 * (8 + 8) = 32 bytes
  m.mutable_multi_get()->set_keys(1, "k4");
  CHECK(w.Run(m).multi_get().values_size() == 2);  // 16 + 8 = 24 bytes
}

TEST_CASE("Get, Wait and MultiGet: answered when the keys exist, kMustWait when waiting") {
  World w;
  REQUIRE(w.Set("a", "1").code() == 0);
  Request g;
  g.mutable_get()->set_key("missing");
  Response r = w.Run(g);
  CHECK_FALSE(r.get().found());
  g.mutable_get()->set_wait(true);
  Response parked;
  CHECK(Apply(w.state, w.ctx(), g, &parked) == Applied::kMustWait);
  g.mutable_get()->set_key("a");
  r = w.Run(g);
  CHECK(r.get().found());
  CHECK(r.get().value() == "1");
  CHECK(r.get().revision() == 1);

  Request wait;
  wait.mutable_wait()->add_keys("a");
  wait.mutable_wait()->add_keys("b");
  CHECK(Apply(w.state, w.ctx(), wait, &parked) == Applied::kMustWait);
  Request mg;
  mg.mutable_multi_get()->add_keys("a");
  mg.mutable_multi_get()->add_keys("b");
  r = w.Run(mg);  // without wait: answered with b absent
  CHECK(r.multi_get().found(0));
  CHECK_FALSE(r.multi_get().found(1));
  mg.mutable_multi_get()->set_wait(true);
  CHECK(Apply(w.state, w.ctx(), mg, &parked) == Applied::kMustWait);
  REQUIRE(w.Set("b", "2").code() == 0);
  CHECK(w.Run(wait).has_wait());
  Response later;
  AnswerRead(w.state, w.options, mg, &later);  // what a parked MultiGet gets once b exists
  CHECK(later.multi_get().values(0) == "1");
  CHECK(later.multi_get().values(1) == "2");
}

TEST_CASE("MultiSet validates every pair before writing any") {
  World w;
  Request m;
  auto* kv = m.mutable_multi_set()->add_kvs();
  kv->set_key("x");
  kv->set_value("1");
  kv = m.mutable_multi_set()->add_kvs();
  kv->set_key("y");
  kv->set_value("too long!");  // 9 bytes > max_value_bytes 8
  CHECK(w.Code(w.Run(m)) == absl::StatusCode::kInvalidArgument);
  CHECK(w.state.kv.empty());
  kv->set_value("2");
  Response r = w.Run(m);
  CHECK(r.multi_set().revision() == 2);
  CHECK(w.Value("x") == "1");
  CHECK(w.Value("y") == "2");
}

TEST_CASE("Append creates, grows, and refuses to pass max_value_bytes") {
  World w;
  Request a;
  a.mutable_append()->set_key("log");
  a.mutable_append()->set_value("abc");
  CHECK(w.Run(a).append().new_size() == 3);
  CHECK(w.Run(a).append().new_size() == 6);
  Response r = w.Run(a);  // 9 > 8
  CHECK(w.Code(r) == absl::StatusCode::kInvalidArgument);
  CHECK(w.Value("log") == "abcabc");
  CHECK(w.state.revision == 2);
}

TEST_CASE("Leases: grant, set with a lease, refresh, revoke deletes the lease's keys") {
  World w;
  Request grant;
  grant.mutable_lease_grant()->set_ttl_ms(0);
  CHECK(w.Code(w.Run(grant)) == absl::StatusCode::kInvalidArgument);
  grant.mutable_lease_grant()->set_ttl_ms(1000);
  Response r = w.Run(grant);
  const int64_t id = r.lease_grant().lease_id();
  CHECK(id == 1);
  CHECK(w.state.revision == 1);
  CHECK(w.state.leases.at(id).expiry == w.clock.Now() + absl::Seconds(1));
  CHECK(w.Code(w.Set("k", "v", /*lease=*/42)) == absl::StatusCode::kNotFound);
  REQUIRE(w.Set("k", "v", id).code() == 0);
  REQUIRE(w.Set("j", "v", id).code() == 0);
  REQUIRE(w.Set("free", "v").code() == 0);
  // Refresh moves the expiry to now + ttl.
  w.clock.Advance(absl::Milliseconds(700));
  Request refresh;
  refresh.mutable_lease_refresh()->set_lease_id(id);
  CHECK(w.Run(refresh).lease_refresh().ttl_ms() == 1000);
  CHECK(w.state.leases.at(id).expiry == w.clock.Now() + absl::Seconds(1));
  // Re-setting j without a lease takes it off the lease: the revoke deletes k only.
  REQUIRE(w.Set("j", "w").code() == 0);
  w.rec.log.clear();
  const int64_t rev = w.state.revision;
  Request revoke;
  revoke.mutable_lease_revoke()->set_lease_id(id);
  r = w.Run(revoke);
  CHECK(r.lease_revoke().deleted() == 1);
  CHECK(w.Value("k") == "<absent>");
  CHECK(w.Value("j") == "w");
  CHECK(w.Value("free") == "v");
  CHECK(w.rec.log == std::vector<std::string>{absl::StrCat("del k@", rev + 1),
                                               absl::StrCat("revoke 1@", rev + 2)});
  CHECK(w.Code(w.Run(revoke)) == absl::StatusCode::kNotFound);
  CHECK(w.Code(w.Run(refresh)) == absl::StatusCode::kNotFound);
  CHECK(w.Run(grant).lease_grant().lease_id() == 2);  // ids are never reused
}

TEST_CASE("A request with no operation is INVALID_ARGUMENT") {
  World w;
  Response r = w.Run(Request());
  CHECK(w.Code(r) == absl::StatusCode::kInvalidArgument);
  CHECK(r.message() == "request has no operation set");
}

TEST_CASE("IsWrite: exactly the operations that change the state") {
  World w;
  Request q;
  q.mutable_get()->set_key("k");
  CHECK_FALSE(IsWrite(q));
  q.mutable_lease_refresh()->set_lease_id(1);  // refreshes only move an in-memory expiry
  CHECK_FALSE(IsWrite(q));
  q.mutable_lease_revoke()->set_lease_id(1);
  CHECK(IsWrite(q));
  q.mutable_delete_prefix()->set_prefix("p");
  CHECK(IsWrite(q));
}

}  // namespace
}  // namespace ember::store
