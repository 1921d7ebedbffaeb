// Which store requests may be applied twice with the same state and answer: the one rule shared by
// the client's resend-after-reconnect (client_retry.h) and the etcd backend's retries
// (etcd_client.h). Add, Append, CompareSet, DeletePrefix and LeaseGrant may not.
#ifndef EMBER_RUNTIME_STORE_IDEMPOTENT_H_
#define EMBER_RUNTIME_STORE_IDEMPOTENT_H_

#include "proto/store.pb.h"

namespace ember::store {

inline bool IdempotentRequest(const v1::Request& r) {
  switch (r.op_case()) {
    case v1::Request::kAdd:
    case v1::Request::kAppend:
    case v1::Request::kCompareSet:
    case v1::Request::kDeletePrefix:
    case v1::Request::kLeaseGrant:
      return false;
    default:
      return true;
  }
}

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_IDEMPOTENT_H_
