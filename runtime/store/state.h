// StoreState: the store's keys, revisions and leases, and one pure apply function per operation.
//
// Each ApplyX(state, context, request, response) validates the request against the limits in
// BackendOptions, changes `state` and fills `response` (a status code on failure, the state left
// unchanged); nothing else. Waiters, watches and the write-ahead log belong to the owner
// (memory_backend.cc): it learns of each change through the StateObserver, called as the change
// happens, in revision order. Ops that may block (Get/MultiGet with wait, Wait) return kMustWait
// instead of answering; the owner parks them and answers with AnswerRead once the keys exist.
//
// Thread-safety: none (thread-compatible). The owner serialises every call on one state.
//
//   StoreState s;
//   ApplyContext ctx{options, clock, /*observer=*/nullptr};
//   v1::Response r;
//   ApplySet(s, ctx, set_request, &r);   // r.code() == 0, s.revision == 1
#ifndef EMBER_RUNTIME_STORE_STATE_H_
#define EMBER_RUNTIME_STORE_STATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/store.pb.h"
#include "runtime/base/clock.h"
#include "runtime/store/backend.h"

namespace ember::store {

struct Entry {
  std::string value;
  int64_t revision = 0;  // the revision that last wrote it
  int64_t lease = 0;     // 0 = none
};

struct Lease {
  int64_t ttl_ms = 0;
  absl::Time expiry;
  absl::flat_hash_set<std::string> keys;  // keys set with this lease
};

struct StoreState {
  absl::btree_map<std::string, Entry> kv;
  int64_t revision = 0;  // global: +1 per put, delete, lease grant and lease revoke
  absl::flat_hash_map<int64_t, Lease> leases;
  int64_t next_lease = 1;
};

// Told of every change as it is made (the state already changed; `revision` is the new one).
// Called with the owner's lock held: it must not call back into the state or block.
class StateObserver {
 public:
  virtual ~StateObserver() = default;
  virtual void OnPut(const std::string& key, const Entry& entry) = 0;
  virtual void OnDelete(const std::string& key, int64_t revision) = 0;
  virtual void OnLeaseGrant(int64_t lease_id, int64_t ttl_ms, int64_t revision) = 0;
  virtual void OnLeaseRevoke(int64_t lease_id, int64_t revision) = 0;
};

// What an apply function needs besides the state. All borrowed.
struct ApplyContext {
  const BackendOptions& options;  // the limits (key, value, keys per request, response size)
  base::Clock* clock;             // lease expiry (LeaseGrant, LeaseRefresh); not null
  StateObserver* observer;        // null = nobody listens (WAL replay, tests)
};

enum class Applied {
  kAnswered,  // the response is filled
  kMustWait,  // a blocking read whose keys are missing: park it, answer with AnswerRead later
};

// Sets code and message of `r`.
void SetError(v1::Response* r, absl::StatusCode code, std::string message);

// Whether `r` changes the state (and so is logged when durable).
bool IsWrite(const v1::Request& r);

// --- the mutations every write is made of (the WAL replays through these too) -------------------
// Puts key=value (lease 0 = none; the key leaves its old lease). Notifies OnPut.
void PutKey(StoreState& s, const std::string& key, std::string value, int64_t lease,
            StateObserver* observer);
// Deletes key; false (nothing changes, no revision) if it does not exist. Notifies OnDelete.
bool EraseKey(StoreState& s, const std::string& key, StateObserver* observer);
// Deletes the lease and its keys (one OnDelete each, then OnLeaseRevoke). Returns the number of
// keys deleted, or -1 (nothing changes) if the lease does not exist.
int64_t RevokeLeaseAndKeys(StoreState& s, int64_t lease_id, StateObserver* observer);

// --- one function per operation ------------------------------------------------------------------
void ApplySet(StoreState& s, const ApplyContext& c, const v1::SetRequest& q, v1::Response* r);
Applied ApplyGet(StoreState& s, const ApplyContext& c, const v1::GetRequest& q,
                 v1::Response* r);
void ApplyAdd(StoreState& s, const ApplyContext& c, const v1::AddRequest& q, v1::Response* r);
void ApplyCompareSet(StoreState& s, const ApplyContext& c, const v1::CompareSetRequest& q,
                     v1::Response* r);
Applied ApplyWait(StoreState& s, const ApplyContext& c, const v1::WaitRequest& q,
                  v1::Response* r);
void ApplyCheck(StoreState& s, const ApplyContext& c, const v1::CheckRequest& q,
                v1::Response* r);
void ApplyDelete(StoreState& s, const ApplyContext& c, const v1::DeleteRequest& q,
                 v1::Response* r);
void ApplyDeletePrefix(StoreState& s, const ApplyContext& c, const v1::DeletePrefixRequest& q,
                       v1::Response* r);
void ApplyNumKeys(StoreState& s, const ApplyContext& c, const v1::NumKeysRequest& q,
                  v1::Response* r);
Applied ApplyMultiGet(StoreState& s, const ApplyContext& c, const v1::MultiGetRequest& q,
                      v1::Response* r);
void ApplyMultiSet(StoreState& s, const ApplyContext& c, const v1::MultiSetRequest& q,
                   v1::Response* r);
void ApplyAppend(StoreState& s, const ApplyContext& c, const v1::AppendRequest& q,
                 v1::Response* r);
void ApplyListKeys(StoreState& s, const ApplyContext& c, const v1::ListKeysRequest& q,
                   v1::Response* r);
void ApplyLeaseGrant(StoreState& s, const ApplyContext& c, const v1::LeaseGrantRequest& q,
                     v1::Response* r);
void ApplyLeaseRefresh(StoreState& s, const ApplyContext& c, const v1::LeaseRefreshRequest& q,
                       v1::Response* r);
void ApplyLeaseRevoke(StoreState& s, const ApplyContext& c, const v1::LeaseRevokeRequest& q,
                      v1::Response* r);

// The keys a Get, Wait or MultiGet names (empty for other ops).
std::vector<std::string> KeysWaitedFor(const v1::Request& req);

// DEADLINE_EXCEEDED for a blocking read that timed out, naming up to 8 of the keys still missing
// (`exists` says whether a key exists now).
void SetWaitTimedOut(const v1::Request& req, const std::function<bool(const std::string&)>& exists,
                     v1::Response* r);

// A write carrying a Fence (proto/store.proto) passes when the fence key is absent or holds an
// integer <= the request's epoch; otherwise FAILED_PRECONDITION "write refused by fence '<key>':
// this client belongs to epoch E, the fence is at epoch F ..." in `r` and false. Reads always pass.
bool PassesFence(const StoreState& s, const v1::Request& req, v1::Response* r);

// Dispatches on req.op_case() (INVALID_ARGUMENT when no op is set) after PassesFence. Does not
// touch r->id().
Applied Apply(StoreState& s, const ApplyContext& c, const v1::Request& req, v1::Response* r);

// The answer to a Get, MultiGet or Wait from the current state (for a parked one, once its keys
// exist). MultiGet: RESOURCE_EXHAUSTED above options.max_response_bytes.
void AnswerRead(const StoreState& s, const BackendOptions& options, const v1::Request& req,
                v1::Response* r);

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_STATE_H_
