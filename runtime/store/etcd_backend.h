// The store's Backend (backend.h) on an etcd v3 cluster (docs/store-etcd.md).
//
// Every store key K is the etcd key options.prefix + K. An operation reads the keys it names from
// etcd, runs the same pure apply function as the in-memory backend (state.h) on that view, and
// writes what changed back in one etcd transaction that compares each key's mod_revision (or its
// absence); a lost race reads again and retries. So semantics and error messages are the in-memory
// backend's, an acknowledged write is in etcd's raft log, and revisions are etcd's. Leases are etcd
// leases (expiry on etcd's clock; TTLs round up to whole seconds, etcd's minimum applies). Blocking
// Get/Wait/MultiGet park and are woken by one etcd watch on the prefix, open only while someone
// waits (it starts from the revision after the waiter's read, so nothing is missed); Watch() opens
// its own etcd watch from the revision of its initial read, resumed without gap or duplicate after
// a reconnect. An add on a key this backend wrote or read before is one transaction comparing the
// key's known mod_revision (no read); any lost compare returns the keys read in the same call.
// revision() is the highest etcd revision this backend has seen (its own calls, and the watches).
//
// Failures: EtcdClient's retry rule (etcd_client.h) within options.op_timeout; non-idempotent
// operations (Add, Append, CompareSet, DeletePrefix, LeaseGrant) are not re-sent when the outcome
// of an attempt is unknown and fail with UNAVAILABLE saying so.
//
// Thread-safety: as backend.h. Execute returns at once: requests run on a pool of 16 threads, one
// caller (owner) at a time per thread, so a caller's answers keep its request order.
#ifndef EMBER_RUNTIME_STORE_ETCD_BACKEND_H_
#define EMBER_RUNTIME_STORE_ETCD_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/store/backend.h"
#include "runtime/store/etcd_client.h"

namespace ember::store {

// Fails when etcd does not answer a first read within etcd.op_timeout (UNAVAILABLE naming the
// endpoints) or auth fails. options.data_dir, fsync and repair_wal do not apply (etcd persists).
absl::StatusOr<std::unique_ptr<Backend>> NewEtcdBackend(const EtcdOptions& etcd,
                                                        const BackendOptions& options);

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_ETCD_BACKEND_H_
