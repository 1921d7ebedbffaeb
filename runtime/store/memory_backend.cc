// The in-memory backend with optional write-ahead log (see backend.h for the contract and
// docs/store.md for the durability rules).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "proto/store_wal.pb.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/utf8.h"
#include "runtime/store/backend.h"
#include "runtime/store/wal.h"
#include "spdlog/spdlog.h"

namespace ember::store {
namespace {

using v1::Request;
using v1::Response;

constexpr char kWalName[] = "wal.log";
constexpr char kSnapshotName[] = "snapshot";
constexpr mode_t kDirMode = 0700;   // see PrepareDataDir
constexpr mode_t kFileMode = 0600;  // wal.log, snapshot

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

void SetError(Response* r, absl::StatusCode code, std::string msg) {
  r->set_code(static_cast<int>(code));
  r->set_message(std::move(msg));
}

class MemoryBackend : public Backend {
 public:
  MemoryBackend(const BackendOptions& options, base::Clock* clock)
      : options_(options), clock_(clock ? clock : base::RealClock()) {}

  ~MemoryBackend() override {
    Shutdown();
    if (wal_fd_ >= 0) close(wal_fd_);
  }

  absl::Status Open() {
    if (options_.max_response_bytes < options_.max_value_bytes + options_.max_key_bytes + 64) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_response_bytes=", options_.max_response_bytes, " cannot carry one value of "
          "max_value_bytes=", options_.max_value_bytes, "; raise --max-response-bytes"));
    }
    if (!options_.data_dir.empty()) RETURN_IF_ERROR(Recover());
    timer_ = std::thread([this] { TimerLoop(); });
    return absl::OkStatus();
  }

  void Execute(const std::vector<const Request*>& requests, const Done& done,
               uint64_t owner) override {
    std::vector<Response> ready;
    ready.reserve(requests.size());
    Fired fired;
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
        if (!Apply(*req, &r, done, owner, &fired)) ready.push_back(std::move(r));
      }
      seq = wal_seq_;
    }
    if (wrote && durable()) {
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
      for (auto it = kv_.lower_bound(prefix); it != kv_.end() && absl::StartsWith(it->first, prefix);
           ++it) {
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
    return revision_;
  }
  int64_t num_waiters() const override {
    absl::MutexLock l(&mu_);
    return static_cast<int64_t>(waiters_.size());
  }

 private:
  struct Entry {
    std::string value;
    int64_t revision = 0;
    int64_t lease = 0;
  };
  struct Waiter {
    uint64_t owner = 0;
    Request req;
    Done done;
    absl::Time deadline;
    int missing = 0;
  };
  struct Lease {
    int64_t ttl_ms = 0;
    absl::Time expiry;
    absl::flat_hash_set<std::string> keys;
  };
  struct WatchReg {
    std::string prefix;
    WatchSink sink;
  };
  using Fired = std::vector<std::pair<Done, Response>>;

  bool durable() const { return !options_.data_dir.empty(); }

  static void Fire(Fired* fired) {
    for (auto& [d, r] : *fired) d(std::move(r));
    fired->clear();
  }

  // --- validation -------------------------------------------------------------------------------
  bool CheckKey(const std::string& key, Response* r) const {
    if (static_cast<int64_t>(key.size()) > options_.max_key_bytes) {
      SetError(r, absl::StatusCode::kInvalidArgument,
               absl::StrCat("key of ", key.size(), " bytes exceeds the limit max_key_bytes=",
                            options_.max_key_bytes, " (ember-store --max-key-bytes)"));
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
  bool CheckValue(size_t size, Response* r) const {
    if (static_cast<int64_t>(size) > options_.max_value_bytes) {
      SetError(r, absl::StatusCode::kInvalidArgument,
               absl::StrCat("value of ", size, " bytes exceeds the limit max_value_bytes=",
                            options_.max_value_bytes, " (ember-store --max-value-bytes)"));
      return false;
    }
    return true;
  }
  bool CheckCount(size_t n, Response* r) const {
    if (static_cast<int64_t>(n) > options_.max_keys_per_request) {
      SetError(r, absl::StatusCode::kInvalidArgument,
               absl::StrCat(n, " keys in one request exceed the limit max_keys_per_request=",
                            options_.max_keys_per_request));
      return false;
    }
    return true;
  }
  // One response must stay far below protobuf's 2 GiB message limit and fit a transport frame.
  bool CheckResponseSize(int64_t bytes, int64_t keys, Response* r) const {
    if (bytes <= options_.max_response_bytes) return true;
    SetError(r, absl::StatusCode::kResourceExhausted,
             absl::StrCat("the answer for ", keys, " keys would be ", bytes,
                          " bytes, above the limit max_response_bytes=",
                          options_.max_response_bytes,
                          " (ember-store --max-response-bytes); ask for fewer keys per request"));
    return false;
  }
  template <typename KeyList>
  bool CheckKeys(const KeyList& keys, Response* r) const {
    if (!CheckCount(keys.size(), r)) return false;
    for (const auto& k : keys) {
      if (!CheckKey(k, r)) return false;
    }
    return true;
  }

  // --- mutation primitives (REQUIRES mu_) --------------------------------------------------------
  void Log(wal::WalRecord* rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!durable() || replaying_) return;
    rec->set_revision(revision_);
    AppendFramed(rec->SerializeAsString(), &wal_buf_);
    ++wal_seq_;
  }

  void Notify(v1::WatchEvent::Type type, const std::string& key, const std::string& value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (watches_.empty()) return;
    v1::WatchEvent ev;
    ev.set_type(type);
    ev.set_key(key);
    ev.set_value(value);
    ev.set_revision(revision_);
    for (auto& [id, w] : watches_) {
      if (absl::StartsWith(key, w.prefix)) w.sink(ev);
    }
  }

  void Put(const std::string& key, std::string value, int64_t lease, Fired* fired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++revision_;
    Entry& e = kv_[key];
    if (e.lease != 0 && e.lease != lease) {
      auto it = leases_.find(e.lease);
      if (it != leases_.end()) it->second.keys.erase(key);
    }
    if (lease != 0) leases_[lease].keys.insert(key);
    e.value = std::move(value);
    e.revision = revision_;
    e.lease = lease;
    wal::WalRecord rec;
    auto* p = rec.mutable_put();
    p->set_key(key);
    p->set_value(e.value);
    p->set_lease_id(lease);
    Log(&rec);
    Notify(v1::WatchEvent::PUT, key, e.value);
    WakeWaiters(key, fired);
  }

  bool Erase(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = kv_.find(key);
    if (it == kv_.end()) return false;
    if (it->second.lease != 0) {
      auto l = leases_.find(it->second.lease);
      if (l != leases_.end()) l->second.keys.erase(key);
    }
    kv_.erase(it);
    ++revision_;
    wal::WalRecord rec;
    rec.mutable_del()->set_key(key);
    Log(&rec);
    Notify(v1::WatchEvent::DELETE, key, "");
    return true;
  }

  int64_t RevokeLease(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = leases_.find(id);
    if (it == leases_.end()) return -1;
    std::vector<std::string> keys(it->second.keys.begin(), it->second.keys.end());
    leases_.erase(it);
    int64_t n = 0;
    for (const auto& k : keys) n += Erase(k);
    ++revision_;
    wal::WalRecord rec;
    rec.mutable_lease_revoke()->set_lease_id(id);
    Log(&rec);
    return n;
  }

  // --- waiters (REQUIRES mu_) --------------------------------------------------------------------
  void FillWaiterResponse(const Request& req, Response* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (req.has_get()) {
      auto* g = r->mutable_get();
      auto it = kv_.find(req.get().key());
      g->set_found(it != kv_.end());
      if (it != kv_.end()) {
        g->set_value(it->second.value);
        g->set_revision(it->second.revision);
      }
    } else if (req.has_multi_get()) {
      int64_t bytes = 0;
      for (const auto& k : req.multi_get().keys()) {
        auto it = kv_.find(k);
        bytes += 8 + (it != kv_.end() ? static_cast<int64_t>(it->second.value.size()) : 0);
      }
      if (!CheckResponseSize(bytes, req.multi_get().keys_size(), r)) return;
      auto* m = r->mutable_multi_get();
      for (const auto& k : req.multi_get().keys()) {
        auto it = kv_.find(k);
        m->add_found(it != kv_.end());
        m->add_values(it != kv_.end() ? it->second.value : std::string());
      }
    } else {
      r->mutable_wait();
    }
  }

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
      FillWaiterResponse(w->second.req, &r);
      fired->emplace_back(std::move(w->second.done), std::move(r));
      waiters_.erase(w);
    }
  }

  // Parks `req` until every key in `keys` exists. Returns true (parked).
  template <typename KeyList>
  bool Park(const Request& req, const KeyList& keys, int64_t timeout_ms, const Done& done,
            uint64_t owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t id = ++next_id_;
    absl::flat_hash_set<std::string> missing;
    for (const auto& k : keys) {
      if (!kv_.contains(k)) missing.insert(k);
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
    return true;
  }

  // Applies one request. Returns true if it was parked (its response comes later).
  bool Apply(const Request& req, Response* r, const Done& done, uint64_t owner, Fired* fired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (req.op_case()) {
      case Request::kSet: {
        const auto& q = req.set();
        if (!CheckKey(q.key(), r) || !CheckValue(q.value().size(), r)) return false;
        if (q.lease_id() != 0 && !leases_.contains(q.lease_id())) {
          SetError(r, absl::StatusCode::kNotFound,
                   absl::StrCat("lease ", q.lease_id(), " does not exist or has expired; ",
                                "grant a new lease"));
          return false;
        }
        Put(q.key(), q.value(), q.lease_id(), fired);
        r->mutable_set()->set_revision(revision_);
        return false;
      }
      case Request::kGet: {
        const auto& q = req.get();
        if (!CheckKey(q.key(), r)) return false;
        auto it = kv_.find(q.key());
        if (it == kv_.end() && q.wait()) return Park(req, std::vector<std::string>{q.key()},
                                                     q.timeout_ms(), done, owner);
        auto* g = r->mutable_get();
        g->set_found(it != kv_.end());
        if (it != kv_.end()) {
          g->set_value(it->second.value);
          g->set_revision(it->second.revision);
        }
        return false;
      }
      case Request::kAdd: {
        const auto& q = req.add();
        if (!CheckKey(q.key(), r)) return false;
        int64_t cur = 0;
        auto it = kv_.find(q.key());
        if (it != kv_.end() && !absl::SimpleAtoi(it->second.value, &cur)) {
          SetError(r, absl::StatusCode::kInvalidArgument,
                   absl::StrCat("Add on key '", q.key(), "' whose value is not a decimal int64 (",
                                it->second.value.size(), " bytes)"));
          return false;
        }
        int64_t next = 0;
        if (__builtin_add_overflow(cur, q.delta(), &next)) {
          SetError(r, absl::StatusCode::kOutOfRange,
                   absl::StrCat("Add on key '", absl::CHexEscape(q.key()), "': ", cur, " + ",
                                q.delta(), " is outside the int64 range [",
                                std::numeric_limits<int64_t>::min(), ", ",
                                std::numeric_limits<int64_t>::max(), "]; the value is unchanged"));
          return false;
        }
        Put(q.key(), absl::StrCat(next), it != kv_.end() ? it->second.lease : 0, fired);
        r->mutable_add()->set_value(next);
        return false;
      }
      case Request::kCompareSet: {
        const auto& q = req.compare_set();
        if (!CheckKey(q.key(), r) || !CheckValue(q.desired().size(), r)) return false;
        auto it = kv_.find(q.key());
        bool exists = it != kv_.end();
        bool match = q.expect_absent() ? !exists : (exists && it->second.value == q.expected());
        auto* c = r->mutable_compare_set();
        if (match) {
          Put(q.key(), q.desired(), 0, fired);
          c->set_swapped(true);
          c->set_exists(true);
          c->set_current(q.desired());
        } else {
          c->set_exists(exists);
          if (exists) c->set_current(it->second.value);
        }
        return false;
      }
      case Request::kWait: {
        const auto& q = req.wait();
        if (!CheckKeys(q.keys(), r)) return false;
        for (const auto& k : q.keys()) {
          if (!kv_.contains(k)) return Park(req, q.keys(), q.timeout_ms(), done, owner);
        }
        r->mutable_wait();
        return false;
      }
      case Request::kCheck: {
        const auto& q = req.check();
        if (!CheckKeys(q.keys(), r)) return false;
        auto* c = r->mutable_check();
        bool all = true;
        for (const auto& k : q.keys()) {
          bool e = kv_.contains(k);
          c->add_exists(e);
          all &= e;
        }
        c->set_all_exist(all);
        return false;
      }
      case Request::kDelete: {
        if (!CheckKey(req.delete_().key(), r)) return false;
        r->mutable_delete_()->set_deleted(Erase(req.delete_().key()));
        return false;
      }
      case Request::kDeletePrefix: {
        const std::string& p = req.delete_prefix().prefix();
        std::vector<std::string> keys;
        for (auto it = kv_.lower_bound(p); it != kv_.end() && absl::StartsWith(it->first, p); ++it) {
          keys.push_back(it->first);
        }
        for (const auto& k : keys) Erase(k);
        r->mutable_delete_prefix()->set_deleted(static_cast<int64_t>(keys.size()));
        return false;
      }
      case Request::kNumKeys: {
        const std::string& p = req.num_keys().prefix();
        int64_t n = 0;
        if (p.empty()) {
          n = static_cast<int64_t>(kv_.size());
        } else {
          for (auto it = kv_.lower_bound(p); it != kv_.end() && absl::StartsWith(it->first, p);
               ++it) {
            ++n;
          }
        }
        r->mutable_num_keys()->set_count(n);
        return false;
      }
      case Request::kMultiGet: {
        const auto& q = req.multi_get();
        if (!CheckKeys(q.keys(), r)) return false;
        if (q.wait()) {
          for (const auto& k : q.keys()) {
            if (!kv_.contains(k)) return Park(req, q.keys(), q.timeout_ms(), done, owner);
          }
        }
        FillWaiterResponse(req, r);
        return false;
      }
      case Request::kMultiSet: {
        const auto& q = req.multi_set();
        if (!CheckCount(q.kvs_size(), r)) return false;
        for (const auto& kv : q.kvs()) {
          if (!CheckKey(kv.key(), r) || !CheckValue(kv.value().size(), r)) return false;
        }
        for (const auto& kv : q.kvs()) Put(kv.key(), kv.value(), 0, fired);
        r->mutable_multi_set()->set_revision(revision_);
        return false;
      }
      case Request::kAppend: {
        const auto& q = req.append();
        if (!CheckKey(q.key(), r)) return false;
        auto it = kv_.find(q.key());
        std::string v = it != kv_.end() ? it->second.value : std::string();
        if (!CheckValue(v.size() + q.value().size(), r)) return false;
        v += q.value();
        int64_t size = static_cast<int64_t>(v.size());
        Put(q.key(), std::move(v), it != kv_.end() ? it->second.lease : 0, fired);
        r->mutable_append()->set_new_size(size);
        return false;
      }
      case Request::kListKeys: {
        const std::string& p = req.list_keys().prefix();
        int64_t bytes = 0, n = 0;
        for (auto it = kv_.lower_bound(p); it != kv_.end() && absl::StartsWith(it->first, p); ++it) {
          bytes += 8 + static_cast<int64_t>(it->first.size());
          ++n;
        }
        if (!CheckResponseSize(bytes, n, r)) return false;
        auto* l = r->mutable_list_keys();
        for (auto it = kv_.lower_bound(p); it != kv_.end() && absl::StartsWith(it->first, p); ++it) {
          l->add_keys(it->first);
        }
        return false;
      }
      case Request::kLeaseGrant: {
        int64_t ttl = req.lease_grant().ttl_ms();
        if (ttl <= 0) {
          SetError(r, absl::StatusCode::kInvalidArgument,
                   absl::StrCat("lease ttl_ms must be > 0, got ", ttl));
          return false;
        }
        int64_t id = next_lease_++;
        Lease& lease = leases_[id];
        lease.ttl_ms = ttl;
        lease.expiry = clock_->Now() + absl::Milliseconds(ttl);
        ++revision_;
        wal::WalRecord rec;
        rec.mutable_lease_grant()->set_lease_id(id);
        rec.mutable_lease_grant()->set_ttl_ms(ttl);
        Log(&rec);
        r->mutable_lease_grant()->set_lease_id(id);
        r->mutable_lease_grant()->set_ttl_ms(ttl);
        return false;
      }
      case Request::kLeaseRefresh: {
        auto it = leases_.find(req.lease_refresh().lease_id());
        if (it == leases_.end()) {
          SetError(r, absl::StatusCode::kNotFound,
                   absl::StrCat("lease ", req.lease_refresh().lease_id(),
                                " does not exist or has expired; grant a new one and re-set its keys"));
          return false;
        }
        it->second.expiry = clock_->Now() + absl::Milliseconds(it->second.ttl_ms);
        r->mutable_lease_refresh()->set_ttl_ms(it->second.ttl_ms);
        return false;
      }
      case Request::kLeaseRevoke: {
        int64_t n = RevokeLease(req.lease_revoke().lease_id());
        if (n < 0) {
          SetError(r, absl::StatusCode::kNotFound,
                   absl::StrCat("lease ", req.lease_revoke().lease_id(), " does not exist"));
          return false;
        }
        r->mutable_lease_revoke()->set_deleted(n);
        return false;
      }
      case Request::OP_NOT_SET:
        break;
    }
    SetError(r, absl::StatusCode::kInvalidArgument, "request has no operation set");
    return false;
  }

  // --- timers: waiter deadlines and lease expiry ------------------------------------------------
  void TimerLoop() {
    while (true) {
      Fired fired;
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
          std::vector<std::string> missing;
          auto collect = [&](const auto& keys) {
            for (const auto& k : keys) {
              if (!kv_.contains(k)) missing.push_back(k);
            }
          };
          const Request& q = w->second.req;
          if (q.has_get()) missing.push_back(q.get().key());
          if (q.has_wait()) collect(q.wait().keys());
          if (q.has_multi_get()) collect(q.multi_get().keys());
          if (missing.size() > 8) {
            size_t n = missing.size();
            missing.resize(8);
            missing.push_back(absl::StrCat("... (", n, " missing in all)"));
          }
          Response r;
          r.set_id(q.id());
          SetError(&r, absl::StatusCode::kDeadlineExceeded,
                   absl::StrCat("timed out waiting for key(s) [", absl::StrJoin(missing, ", "),
                                "]; has every rank started and is the prefix the same?"));
          fired.emplace_back(std::move(w->second.done), std::move(r));
          waiters_.erase(w);
        }
        std::vector<int64_t> expired;
        for (auto& [id, lease] : leases_) {
          if (lease.expiry <= now) expired.push_back(id);
        }
        for (int64_t id : expired) {
          spdlog::info("store: lease {} expired, deleting {} key(s)", id, leases_[id].keys.size());
          RevokeLease(id);
          wrote = true;
        }
        seq = wal_seq_;
      }
      if (wrote && durable()) CommitWal(seq).IgnoreError();
      Fire(&fired);
    }
  }

  // --- durability -------------------------------------------------------------------------------
  absl::Status CommitWal(int64_t seq) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock wl(&wal_mu_);
    if (wal_written_seq_ >= seq) return absl::OkStatus();
    std::string buf;
    int64_t upto;
    {
      absl::MutexLock l(&mu_);
      buf.swap(wal_buf_);
      upto = wal_seq_;
    }
    absl::Status s = WriteAll(wal_fd_, buf, wal_path_);
    if (s.ok() && options_.fsync == FsyncPolicy::kAlways && fdatasync(wal_fd_) != 0) {
      s = base::ErrnoToStatus(errno, absl::StrCat("fdatasync ", wal_path_));
    }
    if (!s.ok()) {
      spdlog::critical("store: {}", s.ToString());
      return s;
    }
    wal_written_seq_ = upto;
    wal_bytes_ += static_cast<int64_t>(buf.size());
    if (wal_bytes_ > options_.compact_after_bytes) {
      absl::Status c = Compact();
      if (!c.ok()) spdlog::error("store: compaction failed (log keeps growing): {}", c.ToString());
    }
    return absl::OkStatus();
  }

  // REQUIRES wal_mu_. Writes a snapshot of the whole state, then truncates the log. Records still
  // buffered are covered by the snapshot and skipped on replay (revision <= snapshot revision).
  absl::Status Compact() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wal_mu_) {
    wal::Snapshot snap;
    {
      absl::MutexLock l(&mu_);
      snap.set_revision(revision_);
      snap.set_next_lease_id(next_lease_);
      for (const auto& [k, e] : kv_) {
        auto* en = snap.add_entries();
        en->set_key(k);
        en->set_value(e.value);
        en->set_revision(e.revision);
        en->set_lease_id(e.lease);
      }
      for (const auto& [id, lease] : leases_) {
        auto* le = snap.add_leases();
        le->set_lease_id(id);
        le->set_ttl_ms(lease.ttl_ms);
      }
    }
    std::string framed;
    AppendFramed(snap.SerializeAsString(), &framed);
    RETURN_IF_ERROR(WriteFileAtomically(options_.data_dir, kSnapshotName, framed, kFileMode));
    if (ftruncate(wal_fd_, 0) != 0) return base::ErrnoToStatus(errno, "truncate " + wal_path_);
    spdlog::info("store: compacted {} bytes of log into a snapshot of {} keys at revision {}",
                 wal_bytes_, snap.entries_size(), snap.revision());
    wal_bytes_ = 0;
    ++compactions_;
    return absl::OkStatus();
  }

  // Damage found while recovering: without BackendOptions::repair_wal, refuses to start and keeps
  // the file as it is; with it, saves a copy of the log and lets recovery truncate at the damage.
  absl::Status RefuseOrRepair(const std::string& what) {
    if (!options_.repair_wal) {
      return absl::DataLossError(absl::StrCat(
          what, ". The store refuses to start rather than drop acknowledged writes; the file is "
          "left untouched. Restore the data directory from a backup, or restart with --repair to "
          "keep what precedes the damage and discard the rest (a copy of the log is kept)"));
    }
    std::string copy = absl::StrCat(wal_path_, ".damaged-", absl::ToUnixSeconds(absl::Now()));
    RETURN_IF_ERROR(CopyFile(wal_path_, copy));
    spdlog::error("store: --repair: {}; truncating the log there (the original log is kept as {})",
                  what, copy);
    return absl::OkStatus();
  }

  static absl::Status CopyFile(const std::string& from, const std::string& to) {
    int in = open(from.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) return base::ErrnoToStatus(errno, absl::StrCat("open ", from));
    int out = open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kFileMode);
    if (out < 0) {
      int e = errno;
      close(in);
      return base::ErrnoToStatus(e, absl::StrCat("create ", to));
    }
    absl::Status s;
    char buf[1 << 16];
    while (s.ok()) {
      ssize_t n = read(in, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) s = base::ErrnoToStatus(errno, absl::StrCat("read ", from));
      if (n <= 0) break;
      s = WriteAll(out, std::string(buf, static_cast<size_t>(n)), to);
    }
    if (s.ok() && fsync(out) != 0) s = base::ErrnoToStatus(errno, absl::StrCat("fsync ", to));
    close(in);
    close(out);
    return s;
  }

  // The data directory holds every key and value (job specs, uploads): owner-only by default, or
  // owner + group where the operator made it group-accessible; never world-readable.
  absl::Status PrepareDataDir() {
    const std::string& dir = options_.data_dir;
    if (mkdir(dir.c_str(), kDirMode) != 0 && errno != EEXIST) {
      return base::ErrnoToStatus(errno, absl::StrCat("create --data-dir ", dir));
    }
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) return base::ErrnoToStatus(errno, absl::StrCat("stat ", dir));
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--data-dir ", dir, " exists and is not a directory"));
    }
    mode_t want = st.st_mode & 07750 & ~S_IWGRP;  // drop every "other" bit and group write
    if ((st.st_mode & 07777) != want) {
      spdlog::warn("store: tightening --data-dir {} from {:o} to {:o} (it holds every value)", dir,
                   st.st_mode & 07777, want);
      if (chmod(dir.c_str(), want) != 0) {
        return base::ErrnoToStatus(errno, absl::StrCat("chmod ", dir));
      }
    }
    std::string snap = absl::StrCat(dir, "/", kSnapshotName);
    if (chmod(snap.c_str(), kFileMode) != 0 && errno != ENOENT) {
      return base::ErrnoToStatus(errno, absl::StrCat("chmod ", snap));
    }
    return absl::OkStatus();
  }

  absl::Status Recover() {
    RETURN_IF_ERROR(PrepareDataDir());
    absl::MutexLock l(&mu_);
    replaying_ = true;
    Fired none;
    int64_t snap_rev = 0;
    auto snap_file = ReadFramedFile(options_.data_dir + "/" + kSnapshotName);
    if (snap_file.ok()) {
      wal::Snapshot snap;
      if (snap_file->records.size() != 1 || !snap.ParseFromString(snap_file->records[0])) {
        return absl::DataLossError(absl::StrCat(
            "snapshot ", options_.data_dir, "/", kSnapshotName,
            " is corrupt; restore it from a backup or move it away to start from the log only"));
      }
      absl::Time now = clock_->Now();
      for (const auto& le : snap.leases()) {
        leases_[le.lease_id()] = Lease{le.ttl_ms(), now + absl::Milliseconds(le.ttl_ms()), {}};
      }
      for (const auto& en : snap.entries()) {
        kv_[en.key()] = Entry{en.value(), en.revision(), en.lease_id()};
        if (en.lease_id() != 0) leases_[en.lease_id()].keys.insert(en.key());
      }
      revision_ = snap_rev = snap.revision();
      next_lease_ = std::max<int64_t>(next_lease_, snap.next_lease_id());
    } else if (!absl::IsNotFound(snap_file.status())) {
      return snap_file.status();
    }
    wal_path_ = options_.data_dir + "/" + kWalName;
    auto log = ReadFramedFile(wal_path_);
    if (!log.ok() && !absl::IsNotFound(log.status())) return log.status();
    // Where the log stops being trustworthy: the first bad record, or the end of the valid ones.
    int64_t keep_bytes = log.ok() ? log->valid_bytes : 0;
    if (log.ok() && log->corrupt) {
      std::string after = log->next_valid_offset >= 0
                              ? absl::StrCat("a valid record follows at offset ",
                                             log->next_valid_offset)
                              : "it is not the final record";
      RETURN_IF_ERROR(RefuseOrRepair(absl::StrCat(
          "record at offset ", log->valid_bytes, " of ", wal_path_, " (", log->file_bytes,
          " bytes) fails its checksum and ", after, ": the log is damaged, not torn by a crash")));
    }
    int64_t replayed = 0;
    if (log.ok()) {
      for (size_t i = 0; i < log->records.size(); ++i) {
        wal::WalRecord rec;
        if (!rec.ParseFromString(log->records[i])) {
          keep_bytes = log->offsets[i];
          RETURN_IF_ERROR(RefuseOrRepair(absl::StrCat(
              "record at offset ", keep_bytes, " of ", wal_path_,
              " has a valid checksum but does not parse as a WalRecord")));
          break;
        }
        if (rec.revision() <= snap_rev) continue;
        switch (rec.op_case()) {
          case wal::WalRecord::kPut:
            if (rec.put().lease_id() != 0 && !leases_.contains(rec.put().lease_id())) break;
            Put(rec.put().key(), rec.put().value(), rec.put().lease_id(), &none);
            break;
          case wal::WalRecord::kDel:
            Erase(rec.del().key());
            break;
          case wal::WalRecord::kLeaseGrant: {
            int64_t id = rec.lease_grant().lease_id();
            int64_t ttl = rec.lease_grant().ttl_ms();
            leases_[id] = Lease{ttl, clock_->Now() + absl::Milliseconds(ttl), {}};
            next_lease_ = std::max(next_lease_, id + 1);
            break;
          }
          case wal::WalRecord::kLeaseRevoke:
            RevokeLease(rec.lease_revoke().lease_id());
            break;
          case wal::WalRecord::OP_NOT_SET:
            break;
        }
        revision_ = std::max(revision_, rec.revision());
        ++replayed;
      }
    }
    replaying_ = false;
    wal_fd_ = open(wal_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, kFileMode);
    if (wal_fd_ < 0) return base::ErrnoToStatus(errno, absl::StrCat("open ", wal_path_));
    if (fchmod(wal_fd_, kFileMode) != 0) {  // a log written by an older version was 0644
      return base::ErrnoToStatus(errno, absl::StrCat("chmod ", wal_path_));
    }
    if (log.ok()) {
      if (keep_bytes < log->file_bytes) {
        if (log->torn_tail && keep_bytes == log->valid_bytes) {
          spdlog::warn("store: discarding a torn record at the end of {} (offset {}, {} bytes): a "
                       "crash interrupted an unacknowledged write",
                       wal_path_, keep_bytes, log->file_bytes - keep_bytes);
        }
        if (ftruncate(wal_fd_, keep_bytes) != 0) {
          return base::ErrnoToStatus(errno, absl::StrCat("truncate ", wal_path_));
        }
      }
      wal_bytes_ = keep_bytes;
    }
    spdlog::info("store: recovered {} keys at revision {} from {} ({} log records replayed)",
                 kv_.size(), revision_, options_.data_dir, replayed);
    return absl::OkStatus();
  }

  const BackendOptions options_;
  base::Clock* const clock_;
  std::thread timer_;

  mutable absl::Mutex mu_;
  absl::btree_map<std::string, Entry> kv_ ABSL_GUARDED_BY(mu_);
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::vector<uint64_t>> waiters_by_key_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, uint64_t> deadlines_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  int64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, WatchReg> watches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool replaying_ ABSL_GUARDED_BY(mu_) = false;
  std::string wal_buf_ ABSL_GUARDED_BY(mu_);
  int64_t wal_seq_ ABSL_GUARDED_BY(mu_) = 0;

  // Lock order: wal_mu_ before mu_.
  absl::Mutex wal_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int wal_fd_ = -1;
  std::string wal_path_;
  int64_t wal_written_seq_ ABSL_GUARDED_BY(wal_mu_) = 0;
  int64_t wal_bytes_ ABSL_GUARDED_BY(wal_mu_) = 0;
  int64_t compactions_ ABSL_GUARDED_BY(wal_mu_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> NewMemoryBackend(const BackendOptions& options,
                                                          base::Clock* clock) {
  auto b = std::make_unique<MemoryBackend>(options, clock);
  RETURN_IF_ERROR(b->Open());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace ember::store
