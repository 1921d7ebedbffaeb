// How one store request maps onto etcd (etcd_backend.h): which keys it reads, whether it may be
// sent twice, the mutations the pure apply function (state.h) made on the view read from etcd, and
// the one transaction that writes them only if no read key changed meanwhile.
//
// Thread-safety: pure functions; a Recorder belongs to one apply call.
#ifndef EMBER_RUNTIME_STORE_ETCD_MAPPING_H_
#define EMBER_RUNTIME_STORE_ETCD_MAPPING_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "proto/etcd/rpc.pb.h"
#include "proto/store.pb.h"
#include "runtime/store/state.h"

namespace ember::store::etcd_mapping {

inline constexpr int kMaxOpsPerTxn = 128;  // etcd's default --max-txn-ops

// The store keys an operation reads and may write, sorted and unique (prefix reads: PrefixOf).
std::vector<std::string> KeysOf(const v1::Request& r);

// The prefix NumKeys and ListKeys read (null for other ops).
const std::string* PrefixOf(const v1::Request& r);

// Makes the lease a Set names exist in `view`, as far as the apply function can tell; etcd
// checks it for real (NOT_FOUND when it expired).
void AssumeLease(const v1::Request& r, StoreState* view);

// The mutations an apply function made, last one per key.
class Recorder : public StateObserver {
 public:
  struct Change {
    bool put = false;  // false: delete
    std::string value;
    int64_t lease = 0;
  };
  void OnPut(const std::string& key, const Entry& e) override;
  void OnDelete(const std::string& key, int64_t revision) override;
  void OnLeaseGrant(int64_t, int64_t, int64_t) override {}
  void OnLeaseRevoke(int64_t, int64_t) override {}
  std::map<std::string, Change> changes;
};

// The transaction that applies `changes` (keys under `prefix`) only if every key in `keys` still
// has the mod_revision it was read at (`read_at`; a key missing there must still be absent).
etcdserverpb::TxnRequest CompareAndWrite(const std::string& prefix,
                                         const std::vector<std::string>& keys,
                                         const absl::flat_hash_map<std::string, int64_t>& read_at,
                                         const std::map<std::string, Recorder::Change>& changes);

void SetStatus(v1::Response* r, const absl::Status& s);

// The answer the in-memory backend gives to `req` on an empty state: its validation and
// not-found messages, which depend on nothing stored.
v1::Response OnEmptyState(const v1::Request& req, const BackendOptions& options);

}  // namespace ember::store::etcd_mapping

#endif  // EMBER_RUNTIME_STORE_ETCD_MAPPING_H_
