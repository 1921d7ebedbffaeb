// The in-memory backend (see backend.h for the contract and docs/store.md for the durability
// rules). The operations themselves are pure functions of the state (state.h); this file adds what
// is around them: the lock, parked waiters and their deadlines, watches, lease expiry, and the
// write-ahead log (wal_log.h) when options.data_dir is set.

#include <map>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "proto/store_wal.pb.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/backend.h"
#include "runtime/store/state.h"
#include "runtime/store/wal_log.h"
#include "spdlog/spdlog.h"

namespace ember::store {
namespace {

using v1::Request;
using v1::Response;

class MemoryBackend : public Backend {
 public:
  MemoryBackend(const BackendOptions& options, base::Clock* clock)
      : options_(options), clock_(clock ? clock : base::RealClock()) {}

  ~MemoryBackend() override { Shutdown(); }

  absl::Status Open() {
    if (options_.max_response_bytes < options_.max_value_bytes + options_.max_key_bytes + 64) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_response_bytes=", options_.max_response_bytes, " cannot carry one value of "
          "max_value_bytes=", options_.max_value_bytes, "; raise --max-response-bytes"));
    }
    if (!options_.data_dir.empty()) {
      // Recovered without mu_ held: the lock order is WalLog's locks, then mu_ (CommitWal).
      StoreState recovered;
      ASSIGN_OR_RETURN(wal_, WalLog::Open(options_, clock_, &recovered));
      absl::MutexLock l(&mu_);
      state_ = std::move(recovered);
    }
    timer_ = std::thread([this] { TimerLoop(); });
    return absl::OkStatus();
  }

  void Execute(const std::vector<const Request*>& requests, const Done& done,
               uint64_t owner) override {
    absl::InlinedVector<Response, 1> ready;  // one request (TCPStore, fast path): no heap vector
    ready.reserve(requests.size());
    Fired fired;
    Effects effects(this, &fired);
    const ApplyContext ctx{options_, clock_, &effects};
    int64_t seq = 0;
    bool wrote = false;
    {
      absl::MutexLock l(&mu_);
      for (const Request* req : requests) {
        Response r;
        r.set_id(req->id());
        if (shutdown_) {
          SetError(&r, absl::StatusCode::kUnavailable, "store server is shutting down; retry");
          ready.push_back(std::move(r));
          continue;
        }
        wrote |= IsWrite(*req);
        if (Apply(state_, ctx, *req, &r) == Applied::kMustWait) {
          Park(*req, done, owner);
        } else {
          ready.push_back(std::move(r));
        }
      }
      if (wal_ != nullptr) seq = wal_->last_seq();
    }
    if (wrote && wal_ != nullptr) {
      absl::Status s = CommitWal(seq);
      if (!s.ok()) {
        for (size_t i = 0; i < ready.size(); ++i) {
          if (IsWrite(*requests[i]) && ready[i].code() == 0) {
            SetError(&ready[i], absl::StatusCode::kInternal,
                     absl::StrCat("write-ahead log failed, the write may be lost on restart: ",
                                  s.message()));
          }
        }
      }
    }
    for (Response& r : ready) done(std::move(r));
    Fire(&fired);
  }

  void CancelOwner(uint64_t owner) override {
    Fired fired;
    {
      absl::MutexLock l(&mu_);
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        if (it->second.owner == owner) {
          Response r;
          r.set_id(it->second.req.id());
          SetError(&r, absl::StatusCode::kCancelled, "caller went away");
          fired.emplace_back(std::move(it->second.done), std::move(r));
          waiters_.erase(it++);
        } else {
          ++it;
        }
      }
    }
    Fire(&fired);
  }

  uint64_t AddWatch(const std::string& prefix, bool send_initial, WatchSink sink) override {
    absl::MutexLock l(&mu_);
    if (send_initial) {
      for (auto it = state_.kv.lower_bound(prefix);
           it != state_.kv.end() && absl::StartsWith(it->first, prefix); ++it) {
        v1::WatchEvent ev;
        ev.set_type(v1::WatchEvent::PUT);
        ev.set_key(it->first);
        ev.set_value(it->second.value);
        ev.set_revision(it->second.revision);
        sink(ev);
      }
    }
    uint64_t id = ++next_id_;
    watches_[id] = WatchReg{prefix, std::move(sink)};
    return id;
  }

  void RemoveWatch(uint64_t id) override {
    absl::MutexLock l(&mu_);
    watches_.erase(id);
  }

  void Shutdown() override {
    Fired fired;
    {
      absl::MutexLock l(&mu_);
      if (shutdown_) return;
      shutdown_ = true;
      for (auto& [id, w] : waiters_) {
        Response r;
        r.set_id(w.req.id());
        SetError(&r, absl::StatusCode::kUnavailable, "store server shut down while waiting; retry");
        fired.emplace_back(std::move(w.done), std::move(r));
      }
      waiters_.clear();
      waiters_by_key_.clear();
    }
    Fire(&fired);
    if (timer_.joinable()) timer_.join();
  }

  int64_t revision() const override {
    absl::MutexLock l(&mu_);
    return state_.revision;
  }
  int64_t num_waiters() const override {
    absl::MutexLock l(&mu_);
    return static_cast<int64_t>(waiters_.size());
  }

 private:
  struct Waiter {
    uint64_t owner = 0;
    Request req;
    Done done;
    absl::Time deadline;
    int missing = 0;
  };
  struct WatchReg {
    std::string prefix;
    WatchSink sink;
  };
  using Fired = std::vector<std::pair<Done, Response>>;

  static void Fire(Fired* fired) {
    for (auto& [d, r] : *fired) d(std::move(r));
    fired->clear();
  }

  // What a change to the state sets off, as it happens (mu_ held): a WAL record, watch events,
  // waking the waiters of a key that now exists (their answers go to `fired`).
  class Effects : public StateObserver {
   public:
    Effects(MemoryBackend* b, Fired* fired) : b_(b), fired_(fired) {}
    void OnPut(const std::string& key, const Entry& e) override {
      if (b_->wal_ != nullptr) {
        wal::WalRecord rec;
        auto* p = rec.mutable_put();
        p->set_key(key);
        p->set_value(e.value);
        p->set_lease_id(e.lease);
        b_->Log(&rec, e.revision);
      }
      b_->Notify(v1::WatchEvent::PUT, key, e.value, e.revision);
      b_->WakeWaiters(key, fired_);
    }
    void OnDelete(const std::string& key, int64_t revision) override {
      if (b_->wal_ != nullptr) {
        wal::WalRecord rec;
        rec.mutable_del()->set_key(key);
        b_->Log(&rec, revision);
      }
      b_->Notify(v1::WatchEvent::DELETE, key, "", revision);
    }
    void OnLeaseGrant(int64_t lease_id, int64_t ttl_ms, int64_t revision) override {
      if (b_->wal_ == nullptr) return;
      wal::WalRecord rec;
      rec.mutable_lease_grant()->set_lease_id(lease_id);
      rec.mutable_lease_grant()->set_ttl_ms(ttl_ms);
      b_->Log(&rec, revision);
    }
    void OnLeaseRevoke(int64_t lease_id, int64_t revision) override {
      if (b_->wal_ == nullptr) return;
      wal::WalRecord rec;
      rec.mutable_lease_revoke()->set_lease_id(lease_id);
      b_->Log(&rec, revision);
    }

   private:
    MemoryBackend* const b_;
    Fired* const fired_;
  };

  void Log(wal::WalRecord* rec, int64_t revision) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    rec->set_revision(revision);
    wal_->Append(*rec);
  }

  void Notify(v1::WatchEvent::Type type, const std::string& key, const std::string& value,
              int64_t revision) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (watches_.empty()) return;
    v1::WatchEvent ev;
    ev.set_type(type);
    ev.set_key(key);
    ev.set_value(value);
    ev.set_revision(revision);
    for (auto& [id, w] : watches_) {
      if (absl::StartsWith(key, w.prefix)) w.sink(ev);
    }
  }

  // --- waiters (REQUIRES mu_) --------------------------------------------------------------------
  void WakeWaiters(const std::string& key, Fired* fired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = waiters_by_key_.find(key);
    if (it == waiters_by_key_.end()) return;
    std::vector<uint64_t> ids = std::move(it->second);
    waiters_by_key_.erase(it);
    for (uint64_t id : ids) {
      auto w = waiters_.find(id);
      if (w == waiters_.end()) continue;
      if (--w->second.missing > 0) continue;
      Response r;
      r.set_id(w->second.req.id());
      AnswerRead(state_, options_, w->second.req, &r);
      fired->emplace_back(std::move(w->second.done), std::move(r));
      waiters_.erase(w);
    }
  }

  // Parks `req` (a Get, Wait or MultiGet that Apply could not answer) until every key it names
  // exists or its timeout passes.
  void Park(const Request& req, const Done& done, uint64_t owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (req.op_case()) {
      case Request::kGet:
        return Park(req, std::vector<std::string>{req.get().key()}, req.get().timeout_ms(), done,
                    owner);
      case Request::kWait:
        return Park(req, req.wait().keys(), req.wait().timeout_ms(), done, owner);
      default:
        return Park(req, req.multi_get().keys(), req.multi_get().timeout_ms(), done, owner);
    }
  }

  template <typename KeyList>
  void Park(const Request& req, const KeyList& keys, int64_t timeout_ms, const Done& done,
            uint64_t owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t id = ++next_id_;
    absl::flat_hash_set<std::string> missing;
    for (const auto& k : keys) {
      if (!state_.kv.contains(k)) missing.insert(k);
    }
    Waiter w;
    w.owner = owner;
    w.req = req;
    w.done = done;
    absl::Duration t = timeout_ms > 0 ? absl::Milliseconds(timeout_ms)
                                      : options_.default_wait_timeout;
    w.deadline = clock_->Now() + t;
    w.missing = static_cast<int>(missing.size());
    for (const auto& k : missing) waiters_by_key_[k].push_back(id);
    deadlines_.emplace(w.deadline, id);
    waiters_.emplace(id, std::move(w));
  }

  // --- timers: waiter deadlines and lease expiry ------------------------------------------------
  void TimerLoop() {
    while (true) {
      Fired fired;
      Effects effects(this, &fired);
      int64_t seq = 0;
      bool wrote = false;
      {
        absl::MutexLock l(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&shutdown_), absl::Milliseconds(20));
        if (shutdown_) return;
        absl::Time now = clock_->Now();
        while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
          uint64_t id = deadlines_.begin()->second;
          deadlines_.erase(deadlines_.begin());
          auto w = waiters_.find(id);
          if (w == waiters_.end()) continue;
          fired.emplace_back(std::move(w->second.done), TimedOut(w->second.req));
          waiters_.erase(w);
        }
        std::vector<int64_t> expired;
        for (auto& [id, lease] : state_.leases) {
          if (lease.expiry <= now) expired.push_back(id);
        }
        for (int64_t id : expired) {
          spdlog::info("store: lease {} expired, deleting {} key(s)", id,
                       state_.leases[id].keys.size());
          RevokeLeaseAndKeys(state_, id, &effects);
          wrote = true;
        }
        if (wal_ != nullptr) seq = wal_->last_seq();
      }
      if (wrote && wal_ != nullptr) CommitWal(seq).IgnoreError();
      Fire(&fired);
    }
  }

  // DEADLINE_EXCEEDED for a parked request, naming (up to 8 of) the keys still missing.
  Response TimedOut(const Request& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Response r;
    r.set_id(q.id());
    SetWaitTimedOut(
        q, [this](const std::string& k) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return state_.kv.contains(k);
        },
        &r);
    return r;
  }

  absl::Status CommitWal(int64_t seq) ABSL_LOCKS_EXCLUDED(mu_) {
    return wal_->Commit(seq, [this] {
      absl::MutexLock l(&mu_);
      return SnapshotOf(state_);
    });
  }

  const BackendOptions options_;
  base::Clock* const clock_;
  std::thread timer_;
  // Set in Open (null when in-memory only), then constant. Thread-safe itself (wal_log.h).
  std::unique_ptr<WalLog> wal_;

  mutable absl::Mutex mu_;
  StoreState state_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::vector<uint64_t>> waiters_by_key_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, uint64_t> deadlines_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, WatchReg> watches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> NewMemoryBackend(const BackendOptions& options,
                                                          base::Clock* clock) {
  auto b = std::make_unique<MemoryBackend>(options, clock);
  RETURN_IF_ERROR(b->Open());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace ember::store
