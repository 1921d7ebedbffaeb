// EtcdKv: the key-value engine of the etcd backend (etcd_backend.h): views of store keys read from
// etcd, and store requests run as read -> the in-memory backend's pure apply (state.h) -> one
// compare-and-write transaction, again after a lost race.
//
// Etcd round trips: a Set or MultiSet writes without reading; a one-key read is a plain Range;
// an add on a key this engine wrote or read before starts from that (value, mod_revision) instead
// of a read, and its Txn's compare checks the guess; every compare-and-write Txn carries a
// failure branch reading its keys, so a lost race needs no separate read.
//
// Thread-safety: thread-safe. `client` is borrowed and must outlive the engine.
#ifndef EMBER_RUNTIME_STORE_ETCD_BACKEND_KV_H_
#define EMBER_RUNTIME_STORE_ETCD_BACKEND_KV_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/etcd/rpc.pb.h"
#include "proto/store.pb.h"
#include "runtime/store/backend.h"
#include "runtime/store/etcd_client.h"
#include "runtime/store/state.h"

namespace ember::store {

class EtcdKv {
 public:
  EtcdKv(EtcdClient* client, std::string prefix, const BackendOptions& options);

  // Adds the keys under store prefix `prefix` (values too if `values`) to `view`, with etcd's
  // revision of the read. Errors: EtcdClient::Call's.
  absl::Status ReadPrefix(const std::string& prefix, bool values, StoreState* view,
                          absl::Time deadline);
  // The same for `keys`: one Range for one key, else a read-only Txn per 128 keys.
  absl::Status ReadKeys(const std::vector<std::string>& keys, StoreState* view,
                        absl::Time deadline);

  // Runs requests that all name the same keys, applied in order on one view and written in one
  // transaction, until `deadline`; fills each Response. Only a batch of one may answer kMustWait
  // (a blocking read whose keys are missing): then `read_revision` (if set) is the etcd revision
  // of the read that found them missing.
  Applied EvaluateBatch(const std::vector<std::pair<const v1::Request*, v1::Response*>>& batch,
                        absl::Time deadline, int64_t* read_revision = nullptr);

  // A request answered by one etcd call from nothing stored: a Set without a fence (one Put) or a
  // non-blocking Get (one Range). StartOneTrip starts that call asynchronously (gRPC's callback API:
  // it does not block) and returns true, or returns false (another request, an invalid one, or no
  // auth token at hand): use EvaluateBatch. `finish` then runs once, on a gRPC thread, with the
  // answer, or with nullopt when the call failed: run the request on the usual path then (whatever the call did, that path does again: a Put is idempotent).
  using OneTripDone = std::function<void(std::optional<v1::Response>)>;
  bool StartOneTrip(const v1::Request& req, absl::Time deadline, OneTripDone finish);

  // The highest etcd revision seen (NoteRevision: also from the backend's watches).
  int64_t revision() const { return revision_.load(); }
  void NoteRevision(int64_t rev);

 private:
  void AddEntry(const mvccpb::KeyValue& kv, StoreState* view) const;
  absl::Status ReadRange(const etcdserverpb::RangeRequest& q, const std::string& what,
                         StoreState* view, absl::Time deadline);
  std::optional<StoreState> Known(const std::string& key);
  void Remember(const std::string& key, const StoreState& view);

  EtcdClient* const client_;
  const std::string prefix_;  // etcd key = prefix_ + store key
  const BackendOptions options_;
  std::atomic<int64_t> revision_{0};
  absl::Mutex known_mu_;
  absl::flat_hash_map<std::string, Entry> known_ ABSL_GUARDED_BY(known_mu_);  // add keys
};

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_ETCD_BACKEND_KV_H_
