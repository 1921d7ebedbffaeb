// The device backends' policy (device_backend.h states it); the library calls are behind CommDriver.
#include "runtime/comm/device_backend.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/comm_driver.h"
#include "spdlog/spdlog.h"

namespace ember::comm {
namespace {

std::atomic<int> g_legacy_warnings{0};

const char* ModeName(DeviceMode m) {
  switch (m) {
    case DeviceMode::kEager: return "nccl";
    case DeviceMode::kLazy: return "nccl-lazy";
    case DeviceMode::kLegacy: return "nccl-legacy";
  }
  return "?";
}

// A device op's events as the Work sees them: the driver's, plus the abort status if the op was
// still running when its communicators were revoked (its end event then completes, but the op
// never finished: Wait must not report success).
class PolicyEvents : public DeviceEvents {
 public:
  explicit PolicyEvents(std::vector<std::shared_ptr<DeviceEvents>> inner)
      : inner_(std::move(inner)) {}
  void Fail(const absl::Status& why) {
    absl::MutexLock l(&mu_);
    if (failed_.ok()) failed_ = why;
  }
  absl::Status failed() {
    absl::MutexLock l(&mu_);
    return failed_;
  }
  absl::Status StreamWait() override {
    RETURN_IF_ERROR(failed());
    for (auto& e : inner_) RETURN_IF_ERROR(e->StreamWait());
    return absl::OkStatus();
  }
  absl::Status Synchronize(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    absl::Status st;
    for (auto& e : inner_) {
      absl::Status s = e->Synchronize(deadline - absl::Now());
      if (st.ok()) st = s;
    }
    RETURN_IF_ERROR(failed());
    return st;
  }
  bool Done() override {
    for (auto& e : inner_)
      if (!e->Done()) return false;
    return true;
  }
  bool TimesNs(int64_t* s, int64_t* e) override {
    int64_t lo = INT64_MAX, hi = 0;
    for (auto& ev : inner_) {
      int64_t a = 0, b = 0;
      if (!ev->TimesNs(&a, &b)) return false;
      lo = std::min(lo, a);
      hi = std::max(hi, b);
    }
    *s = lo;
    *e = hi;
    return !inner_.empty();
  }

 private:
  const std::vector<std::shared_ptr<DeviceEvents>> inner_;
  absl::Mutex mu_;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

// The communicators of one backend, shared with the process registry so that an abort anywhere
// reaches them while the backend lives.
struct CommSet {
  absl::Mutex mu;
  absl::Status aborted ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<Communicator>> comms ABSL_GUARDED_BY(mu);
  std::vector<std::weak_ptr<PolicyEvents>> ops ABSL_GUARDED_BY(mu);  // enqueued device ops

  // Adds a communicator; if the set is already aborted, revokes it and returns the abort status.
  absl::Status Add(const std::shared_ptr<Communicator>& c) {
    absl::MutexLock l(&mu);
    if (!aborted.ok()) {
      c->Revoke(aborted);
      return aborted;
    }
    comms.push_back(c);
    return absl::OkStatus();
  }
  void AddOp(const std::shared_ptr<PolicyEvents>& e) {
    absl::MutexLock l(&mu);
    if (ops.size() >= 64) {
      std::vector<std::weak_ptr<PolicyEvents>> keep;
      for (auto& w : ops) {
        auto o = w.lock();
        if (o && !o->Done()) keep.push_back(w);
      }
      ops.swap(keep);
    }
    ops.push_back(e);
  }
  absl::Status status() {
    absl::MutexLock l(&mu);
    return aborted;
  }
};

// Every live device backend's CommSet in this process.
class Registry {
 public:
  static Registry& Get() {
    static Registry* r = new Registry;
    return *r;
  }
  void Add(const std::shared_ptr<CommSet>& s) {
    absl::MutexLock l(&mu_);
    sets_.push_back(s);
  }
  // Marks every set aborted (no new op or communicator starts on any) and its unfinished ops
  // failed, then revokes every communicator, outside the registry's lock. Revoke, not abort: the
  // handles stay valid for threads still inside a call on them (the watchdog aborts while the
  // training thread enqueues) and for Shrink; the last reference frees each one.
  void AbortAll(const absl::Status& why) {
    std::vector<std::shared_ptr<CommSet>> live;
    {
      absl::MutexLock l(&mu_);
      std::vector<std::weak_ptr<CommSet>> keep;
      for (auto& w : sets_) {
        if (auto s = w.lock()) {
          live.push_back(s);
          keep.push_back(w);
        }
      }
      sets_.swap(keep);
    }
    std::vector<std::shared_ptr<Communicator>> comms;
    for (auto& s : live) {
      absl::MutexLock l(&s->mu);
      if (s->aborted.ok()) s->aborted = why;
      comms.insert(comms.end(), s->comms.begin(), s->comms.end());
      for (auto& w : s->ops) {
        auto o = w.lock();
        if (o && !o->Done()) o->Fail(why);
      }
    }
    for (auto& c : comms) c->Revoke(why);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::weak_ptr<CommSet>> sets_ ABSL_GUARDED_BY(mu_);
};

struct InFlight {
  std::shared_ptr<DeviceEvents> events;
  absl::Time enqueued;
  absl::Duration timeout;
  std::string what;
};

// NCCL's non-blocking contract: after a call returned in progress, poll ncclCommGetAsyncError
// until it returns anything else before the next call on that communicator (or an event recorded
// behind it). Gives up after `timeout` (DEADLINE_EXCEEDED) or when `set` is aborted meanwhile.
absl::Status Complete(Communicator& c, absl::Status call, CommSet* set,
                      absl::Duration timeout, const std::string& what) {
  if (!IsInProgress(call)) return call;
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0;; ++i) {
    absl::Status s = c.AsyncError();
    if (!IsInProgress(s)) {
      return s.ok() ? s : base::Annotate(s, absl::StrCat(what, " on ", c.Describe()));
    }
    if (absl::Status a = set->status(); !a.ok()) return a;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, " on ", c.Describe(), " still in progress after ", absl::FormatDuration(timeout)));
    }
    if (i > 100) absl::SleepFor(absl::Microseconds(200));
  }
}

class DeviceBackend : public Backend {
 public:
  DeviceBackend(BackendOptions o, DeviceMode mode, std::shared_ptr<CommDriver> driver,
                std::vector<std::string> devices)
      : o_(std::move(o)), mode_(mode), driver_(std::move(driver)), devices_(std::move(devices)),
        set_(std::make_shared<CommSet>()) {
    for (int i = 0; i < o_.size; ++i) pairs_.push_back(std::make_unique<PairSlot>());
    Registry::Get().Add(set_);
  }
  ~DeviceBackend() override {
    absl::MutexLock l(&threads_mu_);
    for (std::thread& t : threads_) t.join();
  }

  // A backend whose main communicator already exists (split/shrink results).
  absl::Status Adopt(std::unique_ptr<Communicator> c) {
    std::shared_ptr<Communicator> s(std::move(c));
    RETURN_IF_ERROR(set_->Add(s));
    absl::MutexLock l(&main_mu_);
    main_.push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status Connect() override {
    return mode_ == DeviceMode::kEager ? EnsureMain() : absl::OkStatus();
  }

  absl::Status Run(const OpDesc& op) override {
    RETURN_IF_ERROR(CheckStream(op.stream, OpTypeName(op.type)));
    RETURN_IF_ERROR(EnsureMain());
    std::vector<std::shared_ptr<Communicator>> comms;
    {
      absl::MutexLock l(&main_mu_);
      comms = main_;
    }
    const std::string what = OpTypeName(op.type);
    absl::Status call;
    if (comms.size() == 1) {
      call = comms[0]->Collective(op);
    } else {
      // nccl-legacy with k devices: in/out are arrays of k per-device pointers.
      std::vector<OpDesc> ops(comms.size(), op);
      std::vector<Communicator*> raw;
      for (size_t d = 0; d < comms.size(); ++d) {
        if (op.in) ops[d].in = static_cast<const void* const*>(op.in)[d];
        if (op.out) ops[d].out = static_cast<void* const*>(op.out)[d];
        raw.push_back(comms[d].get());
      }
      call = driver_->GroupCollective(raw, ops);
    }
    if (!call.ok() && !IsInProgress(call)) return call;
    // Every communicator of the call must have completed it before its end event is recorded.
    for (auto& c : comms) {
      RETURN_IF_ERROR(Complete(*c, call, set_.get(), o_.op_timeout, what));
    }
    std::vector<std::shared_ptr<DeviceEvents>> inner;
    for (auto& c : comms) {
      ASSIGN_OR_RETURN(std::shared_ptr<DeviceEvents> e, c->EndOp(op.stream, /*p2p=*/false));
      if (e) inner.push_back(std::move(e));
    }
    std::shared_ptr<PolicyEvents> ev;
    if (inner.size() == comms.size()) {
      ev = std::make_shared<PolicyEvents>(std::move(inner));
      set_->AddOp(ev);
    }
    absl::MutexLock l(&ev_mu_);
    last_events_ = ev;
    if (ev) {
      in_flight_.push_back({ev, absl::Now(), op.timeout > absl::ZeroDuration() ? op.timeout : o_.op_timeout,
                            absl::StrCat(OpTypeName(op.type), " seq ", op.seq, " count ", op.count,
                                         " ", DTypeName(op.dtype))});
    }
    return absl::OkStatus();
  }

  void PostSend(const void* data, size_t bytes, int dst, int tag,
                std::function<void(absl::Status)> done) override {
    Post(true, const_cast<void*>(data), bytes, dst, tag, std::move(done));
  }
  void PostRecv(void* data, size_t bytes, int src, int tag,
                std::function<void(absl::Status)> done) override {
    Post(false, data, bytes, src, tag, std::move(done));
  }

  void Abort(const absl::Status& why) override { Registry::Get().AbortAll(why); }

  std::string Describe() const override {
    absl::MutexLock l(&main_mu_);
    return absl::StrCat(ModeName(mode_), " via ", driver_->name(), " on ",
                        absl::StrJoin(devices_, ","),
                        main_.empty() ? " (main communicator not created yet)"
                                      : absl::StrCat(", main ", main_[0]->Describe()));
  }

  absl::Status AsyncError() override {
    if (absl::Status st = set_->status(); !st.ok()) {
      // Another group's abort (ABORTED here even when that group timed out: this one did not).
      return absl::AbortedError(absl::StrCat(
          "every communicator of this process was aborted: ", st.message()));
    }
    std::vector<std::shared_ptr<Communicator>> comms;
    {
      absl::MutexLock l(&set_->mu);
      comms = set_->comms;
    }
    for (auto& c : comms) {
      absl::Status s = c->AsyncError();
      // In progress: a call another thread is completing (or a revoke settling), not an error.
      if (!s.ok() && !IsInProgress(s)) {
        return base::Annotate(s, absl::StrCat("communicator ", c->Describe()));
      }
    }
    absl::MutexLock l(&ev_mu_);
    while (!in_flight_.empty() && in_flight_.front().events->Done()) in_flight_.pop_front();
    // Ops finish in order on the stream, but each has its own deadline.
    for (const InFlight& f : in_flight_) {
      if (f.events->Done() || absl::Now() - f.enqueued <= f.timeout) continue;
      return absl::DeadlineExceededError(absl::StrCat(
          "watchdog: ", f.what, " in group '", o_.group_name, "' rank ", o_.rank, "/", o_.size,
          " not finished on ", absl::StrJoin(devices_, ","), " after ",
          absl::FormatDuration(f.timeout)));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<DeviceEvents> TakeOpEvents() override {
    absl::MutexLock l(&ev_mu_);
    return std::move(last_events_);
  }

  bool SplitsInPlace() const override { return true; }
  int GroupRank() const override { return o_.rank; }
  int GroupSize() const override { return o_.size; }

  absl::StatusOr<std::unique_ptr<Backend>> Split(int color, int key,
                                                 BackendOptions child) override {
    RETURN_IF_ERROR(EnsureMain());
    std::shared_ptr<Communicator> parent = Main();
    if (MainCount() != 1) {
      return absl::UnimplementedError(
          "split of an nccl-legacy group with several devices per process; use one device");
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c,
                     driver_->Split(*parent, color, key, InitOptions(child.group_name)));
    if (color < 0 || c == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", o_.rank, " of group '", o_.group_name, "' is not a member of split group '",
          child.group_name, "' (color ", color, "): only members get a communicator"));
    }
    return Child(std::move(child), std::move(c));
  }

  absl::StatusOr<std::unique_ptr<Backend>> Shrink(const std::vector<int>& excluded,
                                                  BackendOptions child) override {
    std::shared_ptr<Communicator> parent = Main();
    if (parent == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shrink of group '", o_.group_name, "': its communicator was never created"));
    }
    if (MainCount() != 1) {
      return absl::UnimplementedError("shrink of an nccl-legacy group with several devices");
    }
    // A revoked parent (after an abort) stays valid; NCCL shrinks it once it is quiescent
    // (AsyncError no longer in progress). An error there (a dead peer) is the driver's cue for
    // NCCL_SHRINK_ABORT.
    const absl::Time deadline = absl::Now() + o_.bootstrap_timeout;
    while (IsInProgress(parent->AsyncError())) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "shrink of group '", o_.group_name, "': the parent communicator ", parent->Describe(),
            " did not become quiescent within ", absl::FormatDuration(o_.bootstrap_timeout)));
      }
      absl::SleepFor(absl::Microseconds(200));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c,
                     driver_->Shrink(*parent, excluded, InitOptions(child.group_name)));
    return Child(std::move(child), std::move(c));
  }

  size_t MemoryBytes() const override {
    absl::MutexLock l(&set_->mu);
    size_t n = 0;
    for (auto& c : set_->comms) n += c->MemoryBytes();
    return n;
  }

 private:
  struct PendingP2P {
    bool send;
    void* data;
    size_t bytes;
    int tag;
    std::function<void(absl::Status)> done;
    void* stream = CurrentStream();  // the submitter's; NCCL's p2p waits on it
  };

  struct PairSlot {
    absl::Mutex mu;
    std::shared_ptr<Communicator> comm ABSL_GUARDED_BY(mu);
    int connects ABSL_GUARDED_BY(mu) = 0;  // the n-th connect pairs with the peer's n-th
    bool connecting ABSL_GUARDED_BY(mu) = false;
    std::deque<PendingP2P> pending ABSL_GUARDED_BY(mu);
  };

  // Device ops order against the submitter's stream; the legacy (null) stream does not order
  // against the non-blocking streams compute runs on, so an op submitted there could read inputs
  // not yet written.
  absl::Status CheckStream(void* stream, const std::string& what) const {
    if (stream != nullptr) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        what, " in group '", o_.group_name, "' (", ModeName(mode_), ") submitted with no current "
        "stream: call comm::SetCurrentStream(<the compute stream>) on this thread first (the "
        "legacy default stream does not order against non-blocking streams)"));
  }

  CommInitOptions InitOptions(std::string tag) const {
    CommInitOptions io;
    io.device = devices_[0];
    io.timeout = o_.bootstrap_timeout;
    io.tag = std::move(tag);
    return io;
  }

  std::shared_ptr<Communicator> Main() {
    absl::MutexLock l(&main_mu_);
    return main_.empty() ? nullptr : main_[0];
  }
  size_t MainCount() {
    absl::MutexLock l(&main_mu_);
    return main_.size();
  }

  absl::StatusOr<std::unique_ptr<Backend>> Child(BackendOptions child,
                                                 std::unique_ptr<Communicator> c) {
    child.rank = c->rank();
    child.size = c->size();
    child.backend = o_.backend;
    child.comm_driver = driver_;
    child.device = o_.device;
    auto b = std::make_unique<DeviceBackend>(std::move(child), mode_, driver_, devices_);
    RETURN_IF_ERROR(b->Adopt(std::move(c)));
    return std::unique_ptr<Backend>(std::move(b));
  }

  // Rank `creator` makes a unique id and publishes it under `key`; the others read it.
  absl::StatusOr<std::string> ExchangeId(const std::string& key, bool creator) {
    if (creator) {
      ASSIGN_OR_RETURN(std::string id, driver_->NewUniqueId());
      RETURN_IF_ERROR(o_.rendezvous->Set(key, id));
      return id;
    }
    return o_.rendezvous->Get(key, o_.bootstrap_timeout);
  }

  absl::Status EnsureMain() {
    RETURN_IF_ERROR(set_->status());
    absl::MutexLock l(&create_mu_);
    {
      absl::MutexLock m(&main_mu_);
      if (!main_.empty()) return absl::OkStatus();
    }
    const std::string key = absl::StrCat(o_.key_prefix, "nccl/uid/", ++main_connects_);
    ASSIGN_OR_RETURN(std::string id, ExchangeId(key, o_.rank == 0));
    std::vector<std::unique_ptr<Communicator>> made;
    if (devices_.size() == 1) {
      ASSIGN_OR_RETURN(auto c, driver_->InitRank(id, o_.rank, o_.size, InitOptions("main")));
      made.push_back(std::move(c));
    } else {
      const int k = static_cast<int>(devices_.size());
      std::vector<int> ranks;
      for (int d = 0; d < k; ++d) ranks.push_back(o_.rank * k + d);
      ASSIGN_OR_RETURN(made, driver_->InitRanks(id, ranks, o_.size * k, devices_,
                                                InitOptions("main")));
    }
    for (auto& c : made) {
      std::shared_ptr<Communicator> s(std::move(c));
      RETURN_IF_ERROR(set_->Add(s));
      absl::MutexLock m(&main_mu_);
      main_.push_back(std::move(s));
    }
    return absl::OkStatus();
  }

  // Bootstraps the 2-rank communicator with `peer` (the lower rank publishes the id).
  absl::StatusOr<std::shared_ptr<Communicator>> ConnectPair(int peer, int n) {
    RETURN_IF_ERROR(set_->status());
    const int lo = std::min(o_.rank, peer), hi = std::max(o_.rank, peer);
    const std::string key = absl::StrCat(o_.key_prefix, "p2p/", lo, "-", hi, "/", n);
    ASSIGN_OR_RETURN(std::string id, ExchangeId(key, o_.rank == lo));
    ASSIGN_OR_RETURN(auto c, driver_->InitRank(id, o_.rank == lo ? 0 : 1, 2,
                                               InitOptions(absl::StrCat("p2p ", lo, "-", hi))));
    std::shared_ptr<Communicator> s(std::move(c));
    RETURN_IF_ERROR(set_->Add(s));
    return s;
  }

  // Issues a send/recv on `c` from the submitter's stream; when the call returned, completes it
  // (polls while in progress) and makes the submitter's stream wait on it before `done`.
  void Issue(const std::shared_ptr<Communicator>& c, int peer, PendingP2P& op) {
    void* prev = CurrentStream();
    SetCurrentStream(op.stream);
    const char* what = op.send ? "send" : "recv";
    // Runs on the driver's thread (cpu) or here (NCCL); holds what it needs, not the backend.
    auto finish = [c, set = set_, timeout = o_.op_timeout, stream = op.stream, what,
                   done = std::move(op.done)](absl::Status s) {
      s = Complete(*c, std::move(s), set.get(), timeout, what);
      if (s.ok()) s = c->EndOp(stream, /*p2p=*/true).status();
      done(std::move(s));
    };
    if (op.send) {
      c->PostSend(op.data, op.bytes, peer, op.tag, std::move(finish));
    } else {
      c->PostRecv(op.data, op.bytes, peer, op.tag, std::move(finish));
    }
    SetCurrentStream(prev);
  }

  void Post(bool send, void* data, size_t bytes, int peer, int tag,
            std::function<void(absl::Status)> done) {
    PendingP2P op{send, data, bytes, tag, std::move(done), CurrentStream()};
    const char* what = send ? "send to " : "recv from ";
    if (absl::Status st = CheckStream(op.stream, send ? "send" : "recv"); !st.ok()) {
      return op.done(st);
    }
    if (mode_ == DeviceMode::kEager) {
      absl::Status st = EnsureMain();
      if (!st.ok()) return op.done(base::Annotate(st, absl::StrCat(what, peer)));
      return Issue(Main(), peer, op);
    }
    if (devices_.size() != 1) {
      return op.done(absl::UnimplementedError(
          "send/recv in an nccl-legacy group with several devices per process; use one device"));
    }
    absl::Status st = set_->status();
    if (!st.ok()) return op.done(st);
    // The pair's communicator is bootstrapped on its own thread, so a caller never blocks on a
    // peer (a ring of first sends would otherwise wait on each other); ops wait in order.
    const int peer_rank = peer < o_.rank ? 0 : 1;
    PairSlot& slot = *pairs_[peer];
    absl::MutexLock l(&slot.mu);
    if (slot.comm) return Issue(slot.comm, peer_rank, op);
    slot.pending.push_back(std::move(op));
    if (slot.connecting) return;
    slot.connecting = true;
    const int n = ++slot.connects;
    absl::MutexLock t(&threads_mu_);
    threads_.emplace_back([this, peer, n, peer_rank, &slot] {
      absl::StatusOr<std::shared_ptr<Communicator>> c = ConnectPair(peer, n);
      absl::MutexLock l(&slot.mu);
      slot.connecting = false;
      std::deque<PendingP2P> ops;
      ops.swap(slot.pending);
      if (c.ok()) slot.comm = *c;
      for (PendingP2P& op : ops) {
        if (c.ok()) {
          Issue(*c, peer_rank, op);
        } else {
          op.done(base::Annotate(c.status(), absl::StrCat("connecting to peer ", peer)));
        }
      }
    });
  }

  const BackendOptions o_;
  const DeviceMode mode_;
  const std::shared_ptr<CommDriver> driver_;
  const std::vector<std::string> devices_;
  const std::shared_ptr<CommSet> set_;
  std::vector<std::unique_ptr<PairSlot>> pairs_;  // per peer; the vector is constant

  absl::Mutex create_mu_;  // serializes main-communicator creation
  int main_connects_ ABSL_GUARDED_BY(create_mu_) = 0;
  mutable absl::Mutex main_mu_;
  std::vector<std::shared_ptr<Communicator>> main_ ABSL_GUARDED_BY(main_mu_);
  absl::Mutex ev_mu_;
  std::shared_ptr<DeviceEvents> last_events_ ABSL_GUARDED_BY(ev_mu_);
  std::deque<InFlight> in_flight_ ABSL_GUARDED_BY(ev_mu_);
  absl::Mutex threads_mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(threads_mu_);  // pair bootstraps
};

}  // namespace

absl::StatusOr<DeviceMode> ParseDeviceBackend(absl::string_view name) {
  if (name == "nccl") return DeviceMode::kEager;
  if (name == "nccl-lazy") return DeviceMode::kLazy;
  if (name == "nccl-legacy") return DeviceMode::kLegacy;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown device backend '", name, "'; use nccl, nccl-lazy or nccl-legacy"));
}

absl::StatusOr<std::unique_ptr<Backend>> MakeDeviceBackend(BackendOptions options) {
  ASSIGN_OR_RETURN(DeviceMode mode, ParseDeviceBackend(options.backend));
  std::vector<std::string> devices = absl::StrSplit(options.device, ',', absl::SkipEmpty());
  if (devices.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backend '", options.backend, "' needs a device (cuda:N); got '", options.device, "'"));
  }
  if (devices.size() > 1 && mode != DeviceMode::kLegacy) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backend '", options.backend, "' binds one device per process, got ", devices.size(),
        " (", options.device, "); use backend 'nccl-legacy' for several devices per process "
        "(deprecated), or one process per device"));
  }
  if (mode == DeviceMode::kLegacy) {
    static std::once_flag once;
    std::call_once(once, [] {
      spdlog::warn("comm: backend 'nccl-legacy' is deprecated and will be removed; use 'nccl' "
                   "(one device per process, eager communicators) or 'nccl-lazy'");
      g_legacy_warnings.fetch_add(1);
    });
  }
  std::shared_ptr<CommDriver> driver = options.comm_driver;
  if (driver == nullptr) {
    ASSIGN_OR_RETURN(driver, MakeNcclDriver(devices[0]));
    options.comm_driver = driver;
  }
  return std::unique_ptr<Backend>(
      new DeviceBackend(std::move(options), mode, std::move(driver), std::move(devices)));
}

namespace {
std::atomic<CommDriverFactory> g_nccl_factory{nullptr};
}  // namespace

namespace {
thread_local void* t_stream = nullptr;
}  // namespace
void SetCurrentStream(void* stream) { t_stream = stream; }

namespace {
constexpr absl::string_view kInProgressPayload = "type.ember/comm.in_progress";
}  // namespace
absl::Status InProgressError(absl::string_view what) {
  absl::Status s = absl::UnavailableError(absl::StrCat(what, ": in progress (ncclInProgress)"));
  s.SetPayload(kInProgressPayload, absl::Cord("1"));
  return s;
}
bool IsInProgress(const absl::Status& s) {
  return !s.ok() && s.GetPayload(kInProgressPayload).has_value();
}
void* CurrentStream() { return t_stream; }

void RegisterNcclDriverFactory(CommDriverFactory f) { g_nccl_factory.store(f); }

absl::StatusOr<std::shared_ptr<CommDriver>> MakeNcclDriver(const std::string& device) {
  CommDriverFactory f = g_nccl_factory.load();
  if (f == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "no NCCL in this binary (for device ", device, "): it was built without CUDA/NCCL or "
        "without //runtime/comm:nccl_driver; use backend cpu, or a device build"));
  }
  return f(device);
}

namespace internal {
int LegacyWarningCount() { return g_legacy_warnings.load(); }
}  // namespace internal

}  // namespace ember::comm
