// The store's operations as pure functions of (state, request): see state.h.
#include "runtime/store/state.h"

#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/utf8.h"

namespace ember::store {
namespace {

using v1::Request;
using v1::Response;

// --- validation ----------------------------------------------------------------------------------
bool CheckKey(const BackendOptions& o, const std::string& key, Response* r) {
  if (static_cast<int64_t>(key.size()) > o.max_key_bytes) {
    SetError(r, absl::StatusCode::kInvalidArgument,
             absl::StrCat("key of ", key.size(), " bytes exceeds the limit max_key_bytes=",
                          o.max_key_bytes, " (ember-store --max-key-bytes)"));
    return false;
  }
  // Keys are UTF-8 text (proto/store.proto); the wire type is bytes so that a bad key reaches
  // this check instead of failing the whole message's parse.
  if (const size_t bad = base::FirstInvalidUtf8(key); bad != absl::string_view::npos) {
    SetError(r, absl::StatusCode::kInvalidArgument,
             absl::StrCat("key '", absl::CHexEscape(key.substr(0, 64)),
                          key.size() > 64 ? "..." : "", "' is not valid UTF-8 at byte ", bad,
                          "; keys must be UTF-8 text"));
    return false;
  }
  return true;
}

bool CheckValue(const BackendOptions& o, size_t size, Response* r) {
  if (static_cast<int64_t>(size) > o.max_value_bytes) {
    SetError(r, absl::StatusCode::kInvalidArgument,
             absl::StrCat("value of ", size, " bytes exceeds the limit max_value_bytes=",
                          o.max_value_bytes, " (ember-store --max-value-bytes)"));
    return false;
  }
  return true;
}

bool CheckCount(const BackendOptions& o, size_t n, Response* r) {
  if (static_cast<int64_t>(n) > o.max_keys_per_request) {
    SetError(r, absl::StatusCode::kInvalidArgument,
             absl::StrCat(n, " keys in one request exceed the limit max_keys_per_request=",
                          o.max_keys_per_request));
    return false;
  }
  return true;
}

// One response must stay far below protobuf's 2 GiB message limit and fit a transport frame.
bool CheckResponseSize(const BackendOptions& o, int64_t bytes, int64_t keys, Response* r) {
  if (bytes <= o.max_response_bytes) return true;
  SetError(r, absl::StatusCode::kResourceExhausted,
           absl::StrCat("the answer for ", keys, " keys would be ", bytes,
                        " bytes, above the limit max_response_bytes=", o.max_response_bytes,
                        " (ember-store --max-response-bytes); ask for fewer keys per request"));
  return false;
}

template <typename KeyList>
bool CheckKeys(const BackendOptions& o, const KeyList& keys, Response* r) {
  if (!CheckCount(o, keys.size(), r)) return false;
  for (const auto& k : keys) {
    if (!CheckKey(o, k, r)) return false;
  }
  return true;
}

template <typename KeyList>
bool AllExist(const StoreState& s, const KeyList& keys) {
  for (const auto& k : keys) {
    if (!s.kv.contains(k)) return false;
  }
  return true;
}

void AnswerMultiGet(const StoreState& s, const BackendOptions& o, const v1::MultiGetRequest& q,
                    Response* r) {
  int64_t bytes = 0;
  for (const auto& k : q.keys()) {
    auto it = s.kv.find(k);
    bytes += 8 + (it != s.kv.end() ? static_cast<int64_t>(it->second.value.size()) : 0);
  }
  if (!CheckResponseSize(o, bytes, q.keys_size(), r)) return;
  auto* m = r->mutable_multi_get();
  for (const auto& k : q.keys()) {
    auto it = s.kv.find(k);
    m->add_found(it != s.kv.end());
    m->add_values(it != s.kv.end() ? it->second.value : std::string());
  }
}

void AnswerGet(const StoreState& s, const v1::GetRequest& q, Response* r) {
  auto* g = r->mutable_get();
  auto it = s.kv.find(q.key());
  g->set_found(it != s.kv.end());
  if (it != s.kv.end()) {
    g->set_value(it->second.value);
    g->set_revision(it->second.revision);
  }
}

}  // namespace

void SetError(Response* r, absl::StatusCode code, std::string message) {
  r->set_code(static_cast<int>(code));
  r->set_message(std::move(message));
}

std::vector<std::string> KeysWaitedFor(const Request& q) {
  std::vector<std::string> keys;
  if (q.has_get()) keys.push_back(q.get().key());
  if (q.has_wait()) keys.assign(q.wait().keys().begin(), q.wait().keys().end());
  if (q.has_multi_get()) keys.assign(q.multi_get().keys().begin(), q.multi_get().keys().end());
  return keys;
}

void SetWaitTimedOut(const Request& q, const std::function<bool(const std::string&)>& exists,
                     Response* r) {
  std::vector<std::string> missing;
  for (std::string& k : KeysWaitedFor(q)) {
    if (q.has_get() || !exists(k)) missing.push_back(std::move(k));
  }
  if (missing.size() > 8) {
    size_t n = missing.size();
    missing.resize(8);
    missing.push_back(absl::StrCat("... (", n, " missing in all)"));
  }
  SetError(r, absl::StatusCode::kDeadlineExceeded,
           absl::StrCat("timed out waiting for key(s) [", absl::StrJoin(missing, ", "),
                        "]; has every rank started and is the prefix the same?"));
}

bool IsWrite(const Request& r) {
  switch (r.op_case()) {
    case Request::kSet:
    case Request::kAdd:
    case Request::kCompareSet:
    case Request::kDelete:
    case Request::kDeletePrefix:
    case Request::kMultiSet:
    case Request::kAppend:
    case Request::kLeaseGrant:
    case Request::kLeaseRevoke:
      return true;
    default:
      return false;
  }
}

// --- mutations -----------------------------------------------------------------------------------
void PutKey(StoreState& s, const std::string& key, std::string value, int64_t lease,
            StateObserver* observer) {
  ++s.revision;
  Entry& e = s.kv[key];
  if (e.lease != 0 && e.lease != lease) {
    auto it = s.leases.find(e.lease);
    if (it != s.leases.end()) it->second.keys.erase(key);
  }
  if (lease != 0) s.leases[lease].keys.insert(key);
  e.value = std::move(value);
  e.revision = s.revision;
  e.lease = lease;
  if (observer != nullptr) observer->OnPut(key, e);
}

bool EraseKey(StoreState& s, const std::string& key, StateObserver* observer) {
  auto it = s.kv.find(key);
  if (it == s.kv.end()) return false;
  if (it->second.lease != 0) {
    auto l = s.leases.find(it->second.lease);
    if (l != s.leases.end()) l->second.keys.erase(key);
  }
  s.kv.erase(it);
  ++s.revision;
  if (observer != nullptr) observer->OnDelete(key, s.revision);
  return true;
}

int64_t RevokeLeaseAndKeys(StoreState& s, int64_t lease_id, StateObserver* observer) {
  auto it = s.leases.find(lease_id);
  if (it == s.leases.end()) return -1;
  std::vector<std::string> keys(it->second.keys.begin(), it->second.keys.end());
  s.leases.erase(it);
  int64_t n = 0;
  for (const auto& k : keys) n += EraseKey(s, k, observer);
  ++s.revision;
  if (observer != nullptr) observer->OnLeaseRevoke(lease_id, s.revision);
  return n;
}

// --- operations ----------------------------------------------------------------------------------
void ApplySet(StoreState& s, const ApplyContext& c, const v1::SetRequest& q, Response* r) {
  if (!CheckKey(c.options, q.key(), r) || !CheckValue(c.options, q.value().size(), r)) return;
  if (q.lease_id() != 0 && !s.leases.contains(q.lease_id())) {
    SetError(r, absl::StatusCode::kNotFound,
             absl::StrCat("lease ", q.lease_id(), " does not exist or has expired; ",
                          "grant a new lease"));
    return;
  }
  PutKey(s, q.key(), q.value(), q.lease_id(), c.observer);
  r->mutable_set()->set_revision(s.revision);
}

Applied ApplyGet(StoreState& s, const ApplyContext& c, const v1::GetRequest& q, Response* r) {
  if (!CheckKey(c.options, q.key(), r)) return Applied::kAnswered;
  if (q.wait() && !s.kv.contains(q.key())) return Applied::kMustWait;
  AnswerGet(s, q, r);
  return Applied::kAnswered;
}

void ApplyAdd(StoreState& s, const ApplyContext& c, const v1::AddRequest& q, Response* r) {
  if (!CheckKey(c.options, q.key(), r)) return;
  int64_t cur = 0;
  auto it = s.kv.find(q.key());
  if (it != s.kv.end() && !absl::SimpleAtoi(it->second.value, &cur)) {
    SetError(r, absl::StatusCode::kInvalidArgument,
             absl::StrCat("Add on key '", q.key(), "' whose value is not a decimal int64 (",
                          it->second.value.size(), " bytes)"));
    return;
  }
  int64_t next = 0;
  if (__builtin_add_overflow(cur, q.delta(), &next)) {
    SetError(r, absl::StatusCode::kOutOfRange,
             absl::StrCat("Add on key '", absl::CHexEscape(q.key()), "': ", cur, " + ", q.delta(),
                          " is outside the int64 range [", std::numeric_limits<int64_t>::min(),
                          ", ", std::numeric_limits<int64_t>::max(),
                          "]; the value is unchanged"));
    return;
  }
  PutKey(s, q.key(), absl::StrCat(next), it != s.kv.end() ? it->second.lease : 0, c.observer);
  r->mutable_add()->set_value(next);
}

void ApplyCompareSet(StoreState& s, const ApplyContext& c, const v1::CompareSetRequest& q,
                     Response* r) {
  if (!CheckKey(c.options, q.key(), r) || !CheckValue(c.options, q.desired().size(), r)) return;
  auto it = s.kv.find(q.key());
  const bool exists = it != s.kv.end();
  const bool match = q.expect_absent() ? !exists : (exists && it->second.value == q.expected());
  auto* cs = r->mutable_compare_set();
  if (match) {
    PutKey(s, q.key(), q.desired(), 0, c.observer);
    cs->set_swapped(true);
    cs->set_exists(true);
    cs->set_current(q.desired());
  } else {
    cs->set_exists(exists);
    if (exists) cs->set_current(it->second.value);
  }
}

Applied ApplyWait(StoreState& s, const ApplyContext& c, const v1::WaitRequest& q, Response* r) {
  if (!CheckKeys(c.options, q.keys(), r)) return Applied::kAnswered;
  if (!AllExist(s, q.keys())) return Applied::kMustWait;
  r->mutable_wait();
  return Applied::kAnswered;
}

void ApplyCheck(StoreState& s, const ApplyContext& c, const v1::CheckRequest& q, Response* r) {
  if (!CheckKeys(c.options, q.keys(), r)) return;
  auto* ck = r->mutable_check();
  bool all = true;
  for (const auto& k : q.keys()) {
    bool e = s.kv.contains(k);
    ck->add_exists(e);
    all &= e;
  }
  ck->set_all_exist(all);
}

void ApplyDelete(StoreState& s, const ApplyContext& c, const v1::DeleteRequest& q, Response* r) {
  if (!CheckKey(c.options, q.key(), r)) return;
  r->mutable_delete_()->set_deleted(EraseKey(s, q.key(), c.observer));
}

void ApplyDeletePrefix(StoreState& s, const ApplyContext& c, const v1::DeletePrefixRequest& q,
                       Response* r) {
  const std::string& p = q.prefix();
  std::vector<std::string> keys;
  for (auto it = s.kv.lower_bound(p); it != s.kv.end() && absl::StartsWith(it->first, p); ++it) {
    keys.push_back(it->first);
  }
  for (const auto& k : keys) EraseKey(s, k, c.observer);
  r->mutable_delete_prefix()->set_deleted(static_cast<int64_t>(keys.size()));
}

void ApplyNumKeys(StoreState& s, const ApplyContext&, const v1::NumKeysRequest& q, Response* r) {
  const std::string& p = q.prefix();
  int64_t n = 0;
  if (p.empty()) {
    n = static_cast<int64_t>(s.kv.size());
  } else {
    for (auto it = s.kv.lower_bound(p); it != s.kv.end() && absl::StartsWith(it->first, p); ++it) {
      ++n;
    }
  }
  r->mutable_num_keys()->set_count(n);
}

Applied ApplyMultiGet(StoreState& s, const ApplyContext& c, const v1::MultiGetRequest& q,
                      Response* r) {
  if (!CheckKeys(c.options, q.keys(), r)) return Applied::kAnswered;
  if (q.wait() && !AllExist(s, q.keys())) return Applied::kMustWait;
  AnswerMultiGet(s, c.options, q, r);
  return Applied::kAnswered;
}

void ApplyMultiSet(StoreState& s, const ApplyContext& c, const v1::MultiSetRequest& q,
                   Response* r) {
  if (!CheckCount(c.options, q.kvs_size(), r)) return;
  for (const auto& kv : q.kvs()) {
    if (!CheckKey(c.options, kv.key(), r) || !CheckValue(c.options, kv.value().size(), r)) return;
  }
  for (const auto& kv : q.kvs()) PutKey(s, kv.key(), kv.value(), 0, c.observer);
  r->mutable_multi_set()->set_revision(s.revision);
}

void ApplyAppend(StoreState& s, const ApplyContext& c, const v1::AppendRequest& q, Response* r) {
  if (!CheckKey(c.options, q.key(), r)) return;
  auto it = s.kv.find(q.key());
  std::string v = it != s.kv.end() ? it->second.value : std::string();
  if (!CheckValue(c.options, v.size() + q.value().size(), r)) return;
  v += q.value();
  const int64_t size = static_cast<int64_t>(v.size());
  PutKey(s, q.key(), std::move(v), it != s.kv.end() ? it->second.lease : 0, c.observer);
  r->mutable_append()->set_new_size(size);
}

void ApplyListKeys(StoreState& s, const ApplyContext& c, const v1::ListKeysRequest& q,
                   Response* r) {
  const std::string& p = q.prefix();
  int64_t bytes = 0, n = 0;
  for (auto it = s.kv.lower_bound(p); it != s.kv.end() && absl::StartsWith(it->first, p); ++it) {
    bytes += 8 + static_cast<int64_t>(it->first.size());
    ++n;
  }
  if (!CheckResponseSize(c.options, bytes, n, r)) return;
  auto* l = r->mutable_list_keys();
  for (auto it = s.kv.lower_bound(p); it != s.kv.end() && absl::StartsWith(it->first, p); ++it) {
    l->add_keys(it->first);
  }
}

void ApplyLeaseGrant(StoreState& s, const ApplyContext& c, const v1::LeaseGrantRequest& q,
                     Response* r) {
  const int64_t ttl = q.ttl_ms();
  if (ttl <= 0) {
    SetError(r, absl::StatusCode::kInvalidArgument,
             absl::StrCat("lease ttl_ms must be > 0, got ", ttl));
    return;
  }
  const int64_t id = s.next_lease++;
  Lease& lease = s.leases[id];
  lease.ttl_ms = ttl;
  lease.expiry = c.clock->Now() + absl::Milliseconds(ttl);
  ++s.revision;
  if (c.observer != nullptr) c.observer->OnLeaseGrant(id, ttl, s.revision);
  r->mutable_lease_grant()->set_lease_id(id);
  r->mutable_lease_grant()->set_ttl_ms(ttl);
}

void ApplyLeaseRefresh(StoreState& s, const ApplyContext& c, const v1::LeaseRefreshRequest& q,
                       Response* r) {
  auto it = s.leases.find(q.lease_id());
  if (it == s.leases.end()) {
    SetError(r, absl::StatusCode::kNotFound,
             absl::StrCat("lease ", q.lease_id(),
                          " does not exist or has expired; grant a new one and re-set its keys"));
    return;
  }
  it->second.expiry = c.clock->Now() + absl::Milliseconds(it->second.ttl_ms);
  r->mutable_lease_refresh()->set_ttl_ms(it->second.ttl_ms);
}

void ApplyLeaseRevoke(StoreState& s, const ApplyContext& c, const v1::LeaseRevokeRequest& q,
                      Response* r) {
  const int64_t n = RevokeLeaseAndKeys(s, q.lease_id(), c.observer);
  if (n < 0) {
    SetError(r, absl::StatusCode::kNotFound,
             absl::StrCat("lease ", q.lease_id(), " does not exist"));
    return;
  }
  r->mutable_lease_revoke()->set_deleted(n);
}

bool PassesFence(const StoreState& s, const Request& req, Response* r) {
  if (!req.has_fence() || !IsWrite(req)) return true;
  const v1::Fence& f = req.fence();
  auto it = s.kv.find(f.key());
  if (it == s.kv.end()) return true;  // never bumped: epoch 0
  int64_t at = 0;
  if (!absl::SimpleAtoi(it->second.value, &at)) {
    SetError(r, absl::StatusCode::kFailedPrecondition,
             absl::StrCat("write refused by fence '", f.key(), "': it holds '",
                          absl::CHexEscape(it->second.value.substr(0, 32)),
                          "', not an integer epoch; whoever sets it must write a decimal number"));
    return false;
  }
  if (at <= f.epoch()) return true;
  SetError(r, absl::StatusCode::kFailedPrecondition,
           absl::StrCat("write refused by fence '", f.key(), "': this client belongs to epoch ",
                        f.epoch(), ", the fence is at epoch ", at,
                        " (a newer owner took over, e.g. a new attempt of the job); a stale "
                        "writer must stop"));
  return false;
}

Applied Apply(StoreState& s, const ApplyContext& c, const Request& req, Response* r) {
  if (!PassesFence(s, req, r)) return Applied::kAnswered;
  switch (req.op_case()) {
    case Request::kSet: ApplySet(s, c, req.set(), r); break;
    case Request::kGet: return ApplyGet(s, c, req.get(), r);
    case Request::kAdd: ApplyAdd(s, c, req.add(), r); break;
    case Request::kCompareSet: ApplyCompareSet(s, c, req.compare_set(), r); break;
    case Request::kWait: return ApplyWait(s, c, req.wait(), r);
    case Request::kCheck: ApplyCheck(s, c, req.check(), r); break;
    case Request::kDelete: ApplyDelete(s, c, req.delete_(), r); break;
    case Request::kDeletePrefix: ApplyDeletePrefix(s, c, req.delete_prefix(), r); break;
    case Request::kNumKeys: ApplyNumKeys(s, c, req.num_keys(), r); break;
    case Request::kMultiGet: return ApplyMultiGet(s, c, req.multi_get(), r);
    case Request::kMultiSet: ApplyMultiSet(s, c, req.multi_set(), r); break;
    case Request::kAppend: ApplyAppend(s, c, req.append(), r); break;
    case Request::kListKeys: ApplyListKeys(s, c, req.list_keys(), r); break;
    case Request::kLeaseGrant: ApplyLeaseGrant(s, c, req.lease_grant(), r); break;
    case Request::kLeaseRefresh: ApplyLeaseRefresh(s, c, req.lease_refresh(), r); break;
    case Request::kLeaseRevoke: ApplyLeaseRevoke(s, c, req.lease_revoke(), r); break;
    case Request::OP_NOT_SET:
      SetError(r, absl::StatusCode::kInvalidArgument, "request has no operation set");
      break;
  }
  return Applied::kAnswered;
}

void AnswerRead(const StoreState& s, const BackendOptions& options, const Request& req,
                Response* r) {
  if (req.has_get()) {
    AnswerGet(s, req.get(), r);
  } else if (req.has_multi_get()) {
    AnswerMultiGet(s, options, req.multi_get(), r);
  } else {
    r->mutable_wait();
  }
}

}  // namespace ember::store
