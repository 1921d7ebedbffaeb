// How one store request maps onto etcd: see etcd_mapping.h.
#include "runtime/store/etcd_mapping.h"

#include <algorithm>

namespace ember::store::etcd_mapping {

using v1::Request;
using v1::Response;
namespace pb = etcdserverpb;

std::vector<std::string> KeysOf(const Request& r) {
  std::vector<std::string> keys;
  switch (r.op_case()) {
    case Request::kSet: keys.push_back(r.set().key()); break;
    case Request::kAdd: keys.push_back(r.add().key()); break;
    case Request::kCompareSet: keys.push_back(r.compare_set().key()); break;
    case Request::kDelete: keys.push_back(r.delete_().key()); break;
    case Request::kAppend: keys.push_back(r.append().key()); break;
    case Request::kCheck: keys.assign(r.check().keys().begin(), r.check().keys().end()); break;
    case Request::kMultiSet:
      for (const auto& kv : r.multi_set().kvs()) keys.push_back(kv.key());
      break;
    default: keys = KeysWaitedFor(r); break;
  }
  // A fenced write reads the fence key too, and its compare-and-write includes it: atomic.
  if (r.has_fence() && IsWrite(r)) keys.push_back(r.fence().key());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

const std::string* PrefixOf(const Request& r) {
  if (r.has_num_keys()) return &r.num_keys().prefix();
  if (r.has_list_keys()) return &r.list_keys().prefix();
  return nullptr;
}

void AssumeLease(const Request& r, StoreState* view) {
  if (r.has_set() && r.set().lease_id() != 0) view->leases[r.set().lease_id()];
}

void Recorder::OnPut(const std::string& key, const Entry& e) {
  changes[key] = Change{true, e.value, e.lease};
}

void Recorder::OnDelete(const std::string& key, int64_t) { changes[key] = Change{}; }

pb::TxnRequest CompareAndWrite(const std::string& prefix, const std::vector<std::string>& keys,
                               const absl::flat_hash_map<std::string, int64_t>& read_at,
                               const std::map<std::string, Recorder::Change>& changes) {
  pb::TxnRequest txn;
  for (const std::string& k : keys) {
    pb::Compare* c = txn.add_compare();
    c->set_key(prefix + k);
    auto it = read_at.find(k);
    if (it != read_at.end()) {
      c->set_target(pb::Compare::MOD);
      c->set_mod_revision(it->second);
    } else {
      c->set_target(pb::Compare::CREATE);  // absent: create_revision 0
      c->set_create_revision(0);
    }
  }
  for (const auto& [k, change] : changes) {
    if (change.put) {
      pb::PutRequest* p = txn.add_success()->mutable_request_put();
      p->set_key(prefix + k);
      p->set_value(change.value);
      p->set_lease(change.lease);
    } else {
      txn.add_success()->mutable_request_delete_range()->set_key(prefix + k);
    }
  }
  return txn;
}

void SetStatus(Response* r, const absl::Status& s) {
  SetError(r, s.code(), std::string(s.message()));
}

Response OnEmptyState(const Request& req, const BackendOptions& options) {
  StoreState empty;
  ApplyContext ctx{options, base::RealClock(), nullptr};
  Response r;
  Apply(empty, ctx, req, &r);
  return r;
}

}  // namespace ember::store::etcd_mapping
