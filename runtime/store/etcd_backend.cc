// The etcd backend (see etcd_backend.h): requests on a strand pool, run by EtcdKv (read -> pure
// apply -> one compare-and-write transaction; etcd_backend_kv.h) or as etcd-native ops; concurrent
// adds on one key combined; parked blocking reads woken by an etcd watch that runs while someone
// waits; watches and leases mapped onto etcd's.
#include "runtime/store/etcd_backend.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/etcd_backend_kv.h"
#include "runtime/store/etcd_mapping.h"
#include "runtime/store/etcd_ops.h"
#include "runtime/store/etcd_watch.h"
#include "runtime/store/state.h"
#include "runtime/store/strand_pool.h"
#include "spdlog/spdlog.h"

namespace ember::store {
namespace {

using v1::Request;
using v1::Response;
namespace pb = etcdserverpb;
using etcd_mapping::KeysOf;
using etcd_mapping::SetStatus;

// Requests waiting on etcd at once (each pool thread runs one caller's requests at a time).
constexpr int kPoolThreads = 16;
// The waker watch stops after this long without waiters (CoverLocked).
constexpr absl::Duration kWakerIdle = absl::Seconds(2);

class EtcdBackend : public Backend {
 public:
  EtcdBackend(const EtcdOptions& etcd, const BackendOptions& options)
      : etcd_(etcd), options_(options) {}
  ~EtcdBackend() override { Shutdown(); }

  absl::Status Open() {
    ASSIGN_OR_RETURN(client_, EtcdClient::Create(etcd_));
    kv_ = std::make_unique<EtcdKv>(client_.get(), etcd_.prefix, options_);
    StoreState view;
    absl::Status s = kv_->ReadPrefix("", /*values=*/false, &view, absl::Now() + etcd_.op_timeout);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("etcd backend could not start: ", s.message()));
    }
    timer_ = std::thread([this] { TimerLoop(); });
    worker_ = std::thread([this] { WorkerLoop(); });
    spdlog::info("store: etcd backend on [{}] prefix '{}' at revision {}",
                 client_->endpoint_list(), etcd_.prefix, view.revision);
    return absl::OkStatus();
  }

  // Runs on the pool: each caller (owner) on its own strand, so its answers keep request order
  // while other callers' requests wait on etcd in parallel. Unary calls (owner 0) run alone.
  void Execute(const std::vector<const Request*>& requests, const Done& done,
               uint64_t owner) override {
    auto batch = std::make_shared<std::vector<Request>>();
    batch->reserve(requests.size());
    for (const Request* r : requests) batch->push_back(*r);
    const uint64_t strand = StrandOf(owner);
    if (batch->size() == 1 && StartOneTrip(batch, done, owner, strand)) return;
    pool_.Post(strand, RunTask(batch, done, owner), CancelTask(batch, done));
  }

  // A Set or non-blocking Get as one asynchronous etcd call started on this thread (no pool thread
  // in between: EtcdKv::StartOneTrip), holding the caller's strand until it is answered so later
  // requests keep their order; when the call fails, the request goes first on the strand's usual
  // path (retries). False: not started (post it).
  bool StartOneTrip(const std::shared_ptr<std::vector<Request>>& batch, const Done& done,
                    uint64_t owner, uint64_t strand) {
    const Request& req = batch->front();
    if (!(req.has_set() || (req.has_get() && !req.get().wait())) || !pool_.TryAcquire(strand)) {
      return false;
    }
    {
      absl::MutexLock l(&mu_);
      if (shutdown_) {
        pool_.Release(strand);
        return false;
      }
      ++one_trips_;
    }
    const bool started = kv_->StartOneTrip(
        req, OpDeadline(), [this, batch, done, owner, strand](std::optional<Response> r) {
          if (r) {
            done(std::move(*r));
            pool_.Release(strand);
          } else {
            pool_.ReleaseWith(strand, RunTask(batch, done, owner), CancelTask(batch, done));
          }
          absl::MutexLock l(&mu_);
          --one_trips_;
        });
    if (!started) {
      pool_.Release(strand);
      absl::MutexLock l(&mu_);
      --one_trips_;
    }
    return started;
  }

  // The pool task running `batch` in order, and what answers it when it is dropped instead.
  std::function<void()> RunTask(std::shared_ptr<std::vector<Request>> batch, Done done,
                                uint64_t owner) {
    return [this, batch, done, owner] {
      for (const Request& req : *batch) {
        Response r;
        r.set_id(req.id());
        if (Run(req, &r) == Applied::kMustWait) {
          Park(req, done, owner);
        } else {
          done(std::move(r));
        }
      }
    };
  }
  static std::function<void()> CancelTask(std::shared_ptr<std::vector<Request>> batch, Done done) {
    return [batch, done] {
      for (const Request& req : *batch) {
        Response r;
        r.set_id(req.id());
        SetError(&r, absl::StatusCode::kCancelled,
                 "request dropped before it ran: its caller went away or the store server "
                 "is shutting down");
        done(std::move(r));
      }
    };
  }

  // On the calling thread when the caller's strand is idle: no hand-off to a pool thread and back
  // (two thread wake-ups per op, which cost more than the etcd round trip on a small host).
  Response Call(const Request& req, uint64_t owner) override {
    const uint64_t strand = StrandOf(owner);
    if (!pool_.TryAcquire(strand)) return Backend::Call(req, owner);  // queued: keep the order
    Response r;
    r.set_id(req.id());
    if (Run(req, &r) != Applied::kMustWait) {
      pool_.Release(strand);
      return r;
    }
    return AwaitAnswer([&](const Done& done) {
      Park(req, done, owner);
      pool_.Release(strand);  // (after Park, as on the pool: later requests see it parked)
    });
  }

  void CancelOwner(uint64_t owner) override {
    pool_.Drop(owner);
    std::vector<Waiter> cancelled;
    {
      absl::MutexLock l(&mu_);
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        auto next = std::next(it);
        if (it->second.owner == owner) cancelled.push_back(TakeLocked(it->first));
        it = next;
      }
    }
    for (Waiter& w : cancelled) Answer(&w, absl::CancelledError("caller went away"));
  }

  uint64_t AddWatch(const std::string& prefix, bool send_initial, WatchSink sink) override {
    StoreState view;
    absl::Status s = kv_->ReadPrefix(prefix, /*values=*/true, &view, absl::Now() + etcd_.op_timeout);
    if (!s.ok()) {
      spdlog::error("store: watch on '{}' could not read its start from etcd ({}); it starts "
                    "from etcd's current revision", prefix, std::string(s.message()));
    } else if (send_initial) {
      for (const auto& [key, e] : view.kv) {
        v1::WatchEvent ev;
        ev.set_type(v1::WatchEvent::PUT);
        ev.set_key(key);
        ev.set_value(e.value);
        ev.set_revision(e.revision);
        sink(ev);
      }
    }
    const size_t strip = etcd_.prefix.size();
    auto watcher = std::make_unique<EtcdWatcher>(
        client_.get(), etcd_.prefix + prefix, PrefixRangeEnd(etcd_.prefix + prefix),
        s.ok() ? view.revision + 1 : 0, [sink, strip](const pb::WatchResponse& w) {
          for (const mvccpb::Event& e : w.events()) {
            v1::WatchEvent ev;
            ev.set_type(e.type() == mvccpb::Event::PUT ? v1::WatchEvent::PUT
                                                       : v1::WatchEvent::DELETE);
            ev.set_key(e.kv().key().substr(strip));
            ev.set_value(e.kv().value());
            ev.set_revision(e.kv().mod_revision());
            sink(ev);
          }
        });
    absl::MutexLock l(&mu_);
    const uint64_t id = ++next_id_;
    watches_[id] = std::move(watcher);
    return id;
  }

  void RemoveWatch(uint64_t id) override {
    std::unique_ptr<EtcdWatcher> w;
    {
      absl::MutexLock l(&mu_);
      auto it = watches_.find(id);
      if (it == watches_.end()) return;
      w = std::move(it->second);
      watches_.erase(it);
    }
    w.reset();  // joins its thread: no sink call after this
  }

  void Shutdown() override {
    std::vector<Waiter> left;
    std::map<uint64_t, std::unique_ptr<EtcdWatcher>> watches;
    std::unique_ptr<EtcdWatcher> waker;
    {
      absl::MutexLock l(&mu_);
      if (shutdown_) return;
      shutdown_ = true;
    }
    pool_.Stop();  // (running requests finish: each ends within op_timeout)
    {
      absl::MutexLock l(&mu_);
      // Started etcd calls end within one attempt's deadline; their callbacks use this object.
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return one_trips_ == 0; };
      mu_.Await(absl::Condition(&idle));
      while (!waiters_.empty()) left.push_back(TakeLocked(waiters_.begin()->first));
      for (Waiter& w : woken_) left.push_back(std::move(w));
      woken_.clear();
      watches.swap(watches_);
      waker = std::move(waker_);
    }
    for (Waiter& w : left) {
      Answer(&w, absl::UnavailableError("store server shut down while waiting; retry"));
    }
    watches.clear();
    waker.reset();
    if (timer_.joinable()) timer_.join();
    if (worker_.joinable()) worker_.join();
  }

  int64_t revision() const override { return kv_ != nullptr ? kv_->revision() : 0; }
  int64_t num_waiters() const override {
    absl::MutexLock l(&mu_);
    return static_cast<int64_t>(waiters_.size() + woken_.size());
  }

 private:
  struct Waiter {
    uint64_t owner = 0;
    Request req;
    Done done;
    absl::Time deadline;
    std::vector<std::string> keys;
  };

  // Each caller's requests run on its own strand; unary ones (owner 0) each on a fresh one.
  uint64_t StrandOf(uint64_t owner) {
    return owner != 0 ? owner : (uint64_t{1} << 63) | next_unary_.fetch_add(1);
  }

  absl::Time OpDeadline() const { return absl::Now() + etcd_.op_timeout; }
  // --- one request ------------------------------------------------------------------------------
  Applied Run(const Request& req, Response* r) {
    {
      absl::MutexLock l(&mu_);
      if (shutdown_) {
        SetError(r, absl::StatusCode::kUnavailable, "store server is shutting down; retry");
        return Applied::kAnswered;
      }
    }
    if (req.has_fence() && IsEtcdNativeOp(req) && !req.has_lease_refresh()) {
      // Lease grant/revoke and prefix deletes bypass EvaluateBatch's compare-and-write: the fence
      // is read first (not atomic with the write; fenced clients use them rarely). Other writes
      // read the fence key with their keys and compare it in their Txn.
      StoreState view;
      absl::Status s = kv_->ReadKeys({req.fence().key()}, &view, OpDeadline());
      if (!s.ok()) {
        SetStatus(r, s);
        return Applied::kAnswered;
      }
      if (!PassesFence(view, req, r)) return Applied::kAnswered;
    }
    if (IsEtcdNativeOp(req)) {
      RunEtcdNativeOp({client_.get(), &options_, etcd_.prefix, OpDeadline(),
                       [this](int64_t rev) { kv_->NoteRevision(rev); }},
                      req, r);
      return Applied::kAnswered;
    }
    // Combined adds share one view read for the first's keys: fenced adds run alone.
    if (req.has_add() && !req.has_fence()) return RunAdd(req, r);
    return Evaluate(req, r, OpDeadline());
  }

  // Read -> apply -> compare-and-write, again after a lost race, until `deadline`.
  Applied Evaluate(const Request& req, Response* r, absl::Time deadline,
                   int64_t* read_revision = nullptr) {
    return kv_->EvaluateBatch({{&req, r}}, deadline, read_revision);
  }

  // Adds on one key from different callers combine: while one caller's read-apply-write runs, the
  // others queue; the next batch is one read, the adds in arrival order, one write. (Else N adds
  // on a barrier key race in etcd: one compare-and-write wins per round, N^2/2 writes in all.)
  struct AddSlot {
    const Request* req;
    Response* r;
    bool done = false;
  };
  Applied RunAdd(const Request& req, Response* r) {
    AddSlot me{&req, r};
    absl::MutexLock l(&add_mu_);
    AddQueue& q = adds_[req.add().key()];
    q.pending.push_back(&me);
    if (q.running) {
      add_mu_.Await(absl::Condition(&me.done));  // the running caller answers us
      return Applied::kAnswered;
    }
    q.running = true;
    while (!q.pending.empty()) {
      std::vector<AddSlot*> batch;
      batch.swap(q.pending);
      add_mu_.Unlock();
      std::vector<std::pair<const Request*, Response*>> work;
      for (AddSlot* s : batch) work.emplace_back(s->req, s->r);
      kv_->EvaluateBatch(work, OpDeadline());
      add_mu_.Lock();
      for (AddSlot* s : batch) s->done = true;
    }
    adds_.erase(req.add().key());  // (q is invalid from here)
    return Applied::kAnswered;
  }

  // --- parked blocking reads --------------------------------------------------------------------
  void Park(const Request& req, const Done& done, uint64_t owner) {
    Waiter w;
    w.owner = owner;
    w.req = req;
    w.done = done;
    const int64_t ms = req.has_get()    ? req.get().timeout_ms()
                       : req.has_wait() ? req.wait().timeout_ms()
                                        : req.multi_get().timeout_ms();
    w.deadline = absl::Now() + (ms > 0 ? absl::Milliseconds(ms) : options_.default_wait_timeout);
    w.keys = KeysOf(req);
    Arm(std::move(w));
  }

  // Registers `w` for wake-ups, then reads again: a key set before the registration is seen by
  // that read, one set after it by the waker watch, which covers every revision after the read's.
  // Whoever takes `w` out of waiters_ answers it.
  void Arm(Waiter w) {
    const Request req = w.req;
    uint64_t id;
    {
      absl::MutexLock l(&mu_);
      id = shutdown_ ? 0 : ++next_id_;
      if (id != 0) {
        for (const std::string& k : w.keys) by_key_[k].push_back(id);
        waiters_.emplace(id, std::move(w));
      }
    }
    if (id == 0) {
      return Answer(&w, absl::UnavailableError("store server shut down while waiting; retry"));
    }
    Response r;
    r.set_id(req.id());
    while (true) {
      int64_t read_at = 0;
      if (Evaluate(req, &r, OpDeadline(), &read_at) != Applied::kMustWait) break;
      absl::MutexLock l(&mu_);
      if (waiters_.count(id) == 0 || CoverLocked(read_at + 1)) return;
      // The waker started after our read (for a newer one): a read now is covered.
    }
    Waiter mine;
    {
      absl::MutexLock l(&mu_);
      if (waiters_.count(id) == 0) return;
      mine = TakeLocked(id);
    }
    mine.done(std::move(r));
  }

  // Whether the waker watch delivers every event from revision `from` on; starts it there when it
  // is not running. It runs only while someone waits (TimerLoop stops it when idle): an open watch
  // on the prefix costs every write under it a delivery to this process, and its thread, parked
  // in gRPC, takes the poller role from the threads waiting for their calls' answers.
  bool CoverLocked(int64_t from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    waker_used_ = absl::Now();
    if (shutdown_) return true;  // (Shutdown answers every waiter)
    if (waker_ == nullptr) {
      waker_ = std::make_unique<EtcdWatcher>(
          client_.get(), etcd_.prefix, PrefixRangeEnd(etcd_.prefix), from,
          [this](const pb::WatchResponse& w) { OnEtcdEvents(w); });
      waker_from_ = from;
      return true;
    }
    return waker_from_ <= from;
  }

  Waiter TakeLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = waiters_.find(id);
    Waiter w = std::move(it->second);
    waiters_.erase(it);
    for (const std::string& k : w.keys) {
      auto k_it = by_key_.find(k);
      if (k_it == by_key_.end()) continue;
      auto& ids = k_it->second;
      ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
      if (ids.empty()) by_key_.erase(k_it);
    }
    return w;
  }

  static void Answer(Waiter* w, const absl::Status& s) {
    Response r;
    r.set_id(w->req.id());
    SetStatus(&r, s);
    w->done(std::move(r));
  }

  // The waker watch: a PUT of a key someone waits for answers a parked Get from the event and
  // hands the others to the worker, which evaluates them again.
  void OnEtcdEvents(const pb::WatchResponse& w) {
    std::vector<std::pair<Done, Response>> fired;
    {
      absl::MutexLock l(&mu_);
      for (const mvccpb::Event& e : w.events()) {
        kv_->NoteRevision(e.kv().mod_revision());
        if (e.type() != mvccpb::Event::PUT) continue;
        auto it = by_key_.find(e.kv().key().substr(etcd_.prefix.size()));
        if (it == by_key_.end()) continue;
        const std::vector<uint64_t> ids = it->second;
        for (uint64_t id : ids) {
          Waiter waiter = TakeLocked(id);
          if (waiter.req.has_get()) {
            Response r;
            r.set_id(waiter.req.id());
            r.mutable_get()->set_found(true);
            r.mutable_get()->set_value(e.kv().value());
            r.mutable_get()->set_revision(e.kv().mod_revision());
            fired.emplace_back(std::move(waiter.done), std::move(r));
          } else if (waiter.req.has_wait() && waiter.keys.size() == 1) {
            Response r;  // its one key exists as of this event
            r.set_id(waiter.req.id());
            r.mutable_wait();
            fired.emplace_back(std::move(waiter.done), std::move(r));
          } else {
            woken_.push_back(std::move(waiter));
          }
        }
      }
    }
    for (auto& [done, r] : fired) done(std::move(r));
  }

  void WorkerLoop() {
    while (true) {
      Waiter w;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return shutdown_ || !woken_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (shutdown_) return;
        w = std::move(woken_.front());
        woken_.pop_front();
      }
      Arm(std::move(w));  // answers it if its keys are there, else parks it again
    }
  }

  void TimerLoop() {
    while (true) {
      std::vector<Waiter> expired;
      std::unique_ptr<EtcdWatcher> idle;  // stopped outside mu_ (its callback takes mu_)
      {
        absl::MutexLock l(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&shutdown_), absl::Milliseconds(20));
        if (shutdown_) return;
        const absl::Time now = absl::Now();
        if (!waiters_.empty() || !woken_.empty()) {
          waker_used_ = now;
        } else if (waker_ != nullptr && now - waker_used_ > kWakerIdle) {
          idle = std::move(waker_);
        }
        std::vector<uint64_t> ids;
        for (const auto& [id, w] : waiters_) {
          if (w.deadline <= now) ids.push_back(id);
        }
        for (uint64_t id : ids) expired.push_back(TakeLocked(id));
      }
      idle.reset();
      for (Waiter& w : expired) {
        StoreState view;
        kv_->ReadKeys(w.keys, &view, OpDeadline()).IgnoreError();  // unread = named as missing
        Response r;
        r.set_id(w.req.id());
        SetWaitTimedOut(
            w.req, [&view](const std::string& k) { return view.kv.contains(k); }, &r);
        w.done(std::move(r));
      }
    }
  }

  const EtcdOptions etcd_;
  const BackendOptions options_;
  std::unique_ptr<EtcdClient> client_;    // set in Open, then constant
  std::unique_ptr<EtcdKv> kv_;            // set in Open, then constant
  std::unique_ptr<EtcdWatcher> waker_ ABSL_GUARDED_BY(mu_);  // while someone waits (CoverLocked)
  int64_t waker_from_ ABSL_GUARDED_BY(mu_) = 0;                // the revision it started at
  absl::Time waker_used_ ABSL_GUARDED_BY(mu_);
  std::thread timer_, worker_;
  std::atomic<uint64_t> next_unary_{0};
  StrandPool pool_{kPoolThreads};

  struct AddQueue {
    std::vector<AddSlot*> pending;
    bool running = false;
  };
  absl::Mutex add_mu_;
  std::map<std::string, AddQueue> adds_ ABSL_GUARDED_BY(add_mu_);  // (std::map: stable refs)

  mutable absl::Mutex mu_;
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::vector<uint64_t>> by_key_ ABSL_GUARDED_BY(mu_);
  std::deque<Waiter> woken_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::unique_ptr<EtcdWatcher>> watches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t one_trips_ ABSL_GUARDED_BY(mu_) = 0;  // StartOneTrip calls not yet answered
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> NewEtcdBackend(const EtcdOptions& etcd,
                                                        const BackendOptions& options) {
  auto b = std::make_unique<EtcdBackend>(etcd, options);
  RETURN_IF_ERROR(b->Open());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace ember::store
