// The store operations the etcd backend maps onto etcd's own calls rather than read -> apply ->
// compare-and-write (etcd_backend.h): LeaseGrant (etcd LeaseGrant, TTL rounded up to whole
// seconds), LeaseRefresh (one keep-alive), LeaseRevoke (TimeToLive for the key count, then
// LeaseRevoke) and DeletePrefix (DeleteRange). Validation and not-found answers match the
// in-memory backend (etcd_mapping::OnEmptyState).
//
// Thread-safety: thread-safe (EtcdClient is).
#ifndef EMBER_RUNTIME_STORE_ETCD_OPS_H_
#define EMBER_RUNTIME_STORE_ETCD_OPS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "proto/store.pb.h"
#include "runtime/store/backend.h"
#include "runtime/store/etcd_client.h"

namespace ember::store {

struct EtcdOpContext {
  EtcdClient* client;                          // borrowed
  const BackendOptions* options;               // borrowed
  std::string prefix;                          // Ember's key space in etcd
  absl::Time deadline;                         // of this operation, retries included
  std::function<void(int64_t)> note_revision;  // told etcd's revision after a write
};

bool IsEtcdNativeOp(const v1::Request& req);
// REQUIRES: IsEtcdNativeOp(req). Fills `r` (answer or error).
void RunEtcdNativeOp(const EtcdOpContext& c, const v1::Request& req, v1::Response* r);

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_ETCD_OPS_H_
