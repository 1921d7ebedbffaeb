#include "runtime/comm/cpu_comm_driver.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/flight/recorder.h"

namespace ember::comm {

void FakeEvent::Set() {
  absl::MutexLock l(&mu);
  time_ns = flight::FlightRecorder::NowNanos();
  done = true;
}
bool FakeEvent::IsDone() {
  absl::MutexLock l(&mu);
  return done;
}
bool FakeEvent::WaitFor(absl::Duration timeout) {
  absl::MutexLock l(&mu);
  return mu.AwaitWithTimeout(absl::Condition(&done), timeout);
}
int64_t FakeEvent::time() {
  absl::MutexLock l(&mu);
  return time_ns;
}

FakeStream::FakeStream(std::string name) : name_(std::move(name)), thread_([this] { Loop(); }) {}

FakeStream::~FakeStream() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void FakeStream::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](FakeStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->stop_ || !s->q_.empty(); },
          this));
      if (q_.empty()) return;  // stopping, and everything ran
      task = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
    }
    task();
    absl::MutexLock l(&mu_);
    busy_ = false;
  }
}

void FakeStream::Enqueue(std::function<void()> task) {
  absl::MutexLock l(&mu_);
  q_.push_back(std::move(task));
}

std::shared_ptr<FakeEvent> FakeStream::Record() {
  auto e = std::make_shared<FakeEvent>();
  Enqueue([e] { e->Set(); });
  return e;
}

void FakeStream::WaitEvent(std::shared_ptr<FakeEvent> e) {
  // Gives up only when the stream is being destroyed (an event that will never come then).
  Enqueue([this, e] {
    while (!e->WaitFor(absl::Milliseconds(50))) {
      absl::MutexLock l(&mu_);
      if (stop_) return;
    }
  });
}

bool FakeStream::Synchronize(absl::Duration timeout) { return Record()->WaitFor(timeout); }

bool FakeStream::Idle() {
  absl::MutexLock l(&mu_);
  return q_.empty() && !busy_;
}

namespace {

// The outcome of one op run on a stream (its error becomes the communicator's async error).
struct OpResult {
  absl::Mutex mu;
  absl::Status status ABSL_GUARDED_BY(mu);
};

// An op's start/end events on the communicator's stream.
class FakeOpEvents : public DeviceEvents {
 public:
  FakeOpEvents(CpuCommDriver* driver, std::shared_ptr<FakeEvent> start,
               std::shared_ptr<FakeEvent> end, std::shared_ptr<OpResult> result)
      : driver_(driver), start_(std::move(start)), end_(std::move(end)),
        result_(std::move(result)) {}
  absl::Status StreamWait() override {
    RETURN_IF_ERROR(Recorded("StreamWait"));
    driver_->StreamOf(CurrentStream())->WaitEvent(end_);
    return absl::OkStatus();
  }
  absl::Status Synchronize(absl::Duration timeout) override {
    RETURN_IF_ERROR(Recorded("Synchronize"));
    if (!end_->WaitFor(timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "device op not finished on its stream within ", absl::FormatDuration(timeout)));
    }
    absl::MutexLock l(&result_->mu);
    return result_->status;
  }
  bool Done() override { return end_ != nullptr && end_->IsDone(); }
  bool TimesNs(int64_t* s, int64_t* e) override {
    if (!Done() || !start_->IsDone()) return false;
    *s = start_->time();
    *e = end_->time();
    return true;
  }

 private:
  absl::Status Recorded(const char* what) const {
    if (end_ != nullptr) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        what, " on an end event that was never recorded (cudaStreamWaitEvent before "
              "cudaEventRecord): record it with EndOp after the op's call completed"));
  }
  CpuCommDriver* const driver_;
  const std::shared_ptr<FakeEvent> start_, end_;
  const std::shared_ptr<OpResult> result_;
};

class CpuCommunicator : public Communicator {
 public:
  CpuCommunicator(CpuCommDriver* driver, std::string id, std::string tag, int rank, int size,
                  std::unique_ptr<Backend> b)
      : driver_(driver), id_(std::move(id)), tag_(std::move(tag)), rank_(rank), size_(size),
        b_(std::move(b)), stream_(std::make_unique<FakeStream>(absl::StrCat("comm ", tag_))) {}
  ~CpuCommunicator() override {
    // Destroy: ops still queued (a peer that never comes) fail instead of blocking the join.
    if (!stream_->Synchronize(absl::Seconds(2))) b_->Abort(absl::CancelledError("destroyed"));
    stream_.reset();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& id() const { return id_; }
  int NextSplit() { return ++splits_; }
  int NextShrink() { return ++shrinks_; }

  // Checks that `call` may be made now: the handle is not freed and no call is in progress.
  absl::Status Usable(const std::string& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (freed_) {
      return driver_->Violation(absl::StrCat(call, " on communicator '", tag_, "' rank ", rank_,
                                             " after ncclCommAbort freed it (use after free)"));
    }
    if (pending_) {
      return driver_->Violation(absl::StrCat(
          call, " on communicator '", tag_, "' rank ", rank_, " while its previous call is still "
          "in progress: poll ncclCommGetAsyncError until ncclSuccess first"));
    }
    return absl::OkStatus();
  }
  // Split/Shrink of this (parent) communicator.
  absl::Status UsableAsParent(const std::string& call) {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(Usable(call));
    if (revoked_ && !stream_->Idle()) {
      return driver_->Violation(absl::StrCat(call, " of revoked communicator '", tag_,
                                             "' before it was quiescent (poll AsyncError until OK)"));
    }
    return absl::OkStatus();
  }

  absl::Status Collective(const OpDesc& op) override {
    absl::Status st = CollectiveLocked(op);
    return Leave(std::move(st), OpTypeName(op.type));
  }

  // A call spends time inside the library (seeded, up to FakeNcclOptions::call_latency); a handle
  // freed by another thread meanwhile is a use after free, as on NCCL.
  absl::Status Leave(absl::Status st, const std::string& call) {
    driver_->InsideCall();
    absl::MutexLock l(&mu_);
    if (freed_) {
      return driver_->Violation(absl::StrCat("communicator '", tag_, "' rank ", rank_,
                                             " freed (ncclCommAbort) by another thread while ", call,
                                             " was using it"));
    }
    return st;
  }

  absl::Status CollectiveLocked(const OpDesc& op) {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(Usable(absl::StrCat(OpTypeName(op.type), " (collective)")));
    if (revoked_) return absl::AbortedError(absl::StrCat("communicator ", tag_, " was revoked"));
    if (!async_.ok()) return async_;
    if (op.stream == nullptr) {
      return driver_->Violation(absl::StrCat(
          OpTypeName(op.type), " on communicator '", tag_, "' submitted on the legacy stream: it "
          "does not order against non-blocking compute streams (SetCurrentStream first)"));
    }
    OpDesc d = op;
    d.seq = ++seq_;  // this communicator's own op count: the same on every rank
    // Immediate (CUDA calls before the NCCL call): join the caller's stream, record the start.
    stream_->WaitEvent(driver_->StreamOf(op.stream)->Record());
    start_ = stream_->Record();
    result_ = std::make_shared<OpResult>();
    std::function<void()> enqueue = [this, d, r = result_] {
      stream_->Enqueue([this, d, r] {
        absl::Status st = b_->Run(d);
        if (!st.ok()) {
          {
            absl::MutexLock rl(&r->mu);
            r->status = st;
          }
          absl::MutexLock l(&mu_);
          if (async_.ok()) async_ = st;
        }
      });
    };
    int polls = 0;
    if (driver_->DrawInProgress(&polls)) {
      pending_ = std::move(enqueue);
      polls_left_ = polls;
      return InProgressError(absl::StrCat(OpTypeName(op.type), " on ", tag_));
    }
    enqueue();
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<DeviceEvents>> EndOp(void* caller, bool p2p) override {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(Usable(p2p ? "EndOp (p2p)" : "EndOp (cudaEventRecord of the end event)"));
    if (p2p) return std::shared_ptr<DeviceEvents>();  // p2p moves on the cpu backend's thread
    if (start_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("EndOp on ", tag_, " without an op"));
    }
    auto ev = std::make_shared<FakeOpEvents>(driver_, std::move(start_), stream_->Record(),
                                             std::move(result_));
    (void)caller;
    return std::shared_ptr<DeviceEvents>(std::move(ev));
  }

  void PostSend(const void* data, size_t bytes, int peer, int tag,
                std::function<void(absl::Status)> done) override {
    if (absl::Status s = P2PUsable("ncclSend"); !s.ok()) return done(s);
    b_->PostSend(data, bytes, peer, tag, std::move(done));
  }
  void PostRecv(void* data, size_t bytes, int peer, int tag,
                std::function<void(absl::Status)> done) override {
    if (absl::Status s = P2PUsable("ncclRecv"); !s.ok()) return done(s);
    b_->PostRecv(data, bytes, peer, tag, std::move(done));
  }

  absl::Status AsyncError() override {
    return Leave(AsyncErrorNow(), "ncclCommGetAsyncError");
  }
  absl::Status AsyncErrorNow() {
    std::function<void()> run;
    absl::Status out;
    {
      absl::MutexLock l(&mu_);
      if (freed_) {
        return driver_->Violation(absl::StrCat("ncclCommGetAsyncError on communicator '", tag_,
                                               "' after ncclCommAbort freed it (use after free)"));
      }
      if (pending_) {
        if (--polls_left_ > 0) return InProgressError(absl::StrCat("call on ", tag_));
        run = std::move(pending_);
        pending_ = nullptr;
      }
      if (revoked_ && !run) {
        return stream_->Idle() ? absl::OkStatus()
                               : InProgressError(absl::StrCat("revoke of ", tag_));
      }
      out = async_;
    }
    if (run) run();  // the library enqueues the op now (outside mu_: the task takes it)
    if (!out.ok()) return out;
    return driver_->injected();
  }

  void Revoke(const absl::Status& why) override {
    {
      absl::MutexLock l(&mu_);
      if (freed_) {
        driver_->Violation(absl::StrCat("ncclCommRevoke on communicator '", tag_,
                                        "' after ncclCommAbort freed it (use after free)"));
        return;
      }
      if (revoked_) return;
      revoked_ = true;
      pending_ = nullptr;  // NCCL stops the call in flight
    }
    driver_->Note(absl::StrCat("revoke ", tag_));
    b_->Abort(why);
  }

  void Abort(const absl::Status& why) override {
    {
      absl::MutexLock l(&mu_);
      if (freed_) {
        driver_->Violation(absl::StrCat("ncclCommAbort on communicator '", tag_,
                                        "' that was already aborted (double free)"));
        return;
      }
      freed_ = true;
      pending_ = nullptr;
    }
    driver_->Note(absl::StrCat("abort ", tag_));
    b_->Abort(why);
  }
  size_t MemoryBytes() const override { return 0; }
  std::string Describe() const override {
    return absl::StrCat(tag_, " rank ", rank_, "/", size_, " (", b_->Describe(), ")");
  }

 private:
  absl::Status P2PUsable(const char* call) {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(Usable(call));
    if (revoked_) return absl::AbortedError(absl::StrCat("communicator ", tag_, " was revoked"));
    if (CurrentStream() == nullptr) {
      return driver_->Violation(absl::StrCat(call, " on communicator '", tag_,
                                             "' submitted on the legacy stream"));
    }
    return absl::OkStatus();
  }

  CpuCommDriver* const driver_;
  const std::string id_, tag_;
  const int rank_, size_;
  std::unique_ptr<Backend> b_;
  std::unique_ptr<FakeStream> stream_;
  int64_t seq_ = 0;  // Collective is called by one thread at a time
  std::atomic<int> splits_{0}, shrinks_{0};
  absl::Mutex mu_;
  bool freed_ ABSL_GUARDED_BY(mu_) = false;
  bool revoked_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status async_ ABSL_GUARDED_BY(mu_);       // an op that failed on the stream
  std::function<void()> pending_ ABSL_GUARDED_BY(mu_);  // the call in progress: its enqueue
  int polls_left_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<FakeEvent> start_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<OpResult> result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

CpuCommDriver::CpuCommDriver(std::shared_ptr<Rendezvous> rdzv, BackendOptions base,
                             FakeNcclOptions fake)
    : rdzv_(std::move(rdzv)), base_(std::move(base)), fake_(fake), rng_(fake.seed),
      legacy_(std::make_unique<FakeStream>("legacy")) {}

CpuCommDriver::~CpuCommDriver() = default;

void* CpuCommDriver::NewStream(const std::string& name) {
  auto s = std::make_unique<FakeStream>(name);
  void* p = s.get();
  absl::MutexLock l(&mu_);
  streams_.push_back(std::move(s));
  return p;
}

FakeStream* CpuCommDriver::StreamOf(void* s) {
  return s == nullptr ? legacy_.get() : static_cast<FakeStream*>(s);
}

std::vector<std::string> CpuCommDriver::Violations() const {
  absl::MutexLock l(&mu_);
  return violations_;
}

absl::Status CpuCommDriver::Violation(const std::string& what) {
  {
    absl::MutexLock l(&mu_);
    violations_.push_back(what);
  }
  if (fake_.strict) {
    std::fprintf(stderr, "FAKE NCCL VIOLATION (pid %d): %s\n", getpid(), what.c_str());
    std::fflush(stderr);
    std::abort();
  }
  return absl::InternalError(absl::StrCat("fake NCCL violation: ", what));
}

bool CpuCommDriver::DrawInProgress(int* polls) {
  absl::MutexLock l(&mu_);
  const uint64_t v = rng_();
  *polls = 1 + static_cast<int>((v >> 40) % 3);
  const bool in = static_cast<double>(v & 0xffffffffull) / 4294967296.0 < fake_.in_progress;
  in_progress_count_ += in;
  return in;
}

void CpuCommDriver::InsideCall() {
  if (fake_.call_latency <= absl::ZeroDuration()) return;
  absl::Duration d;
  {
    absl::MutexLock l(&mu_);
    d = fake_.call_latency * (static_cast<double>(rng_() & 0xffff) / 65536.0);
  }
  absl::SleepFor(d);
}

int64_t CpuCommDriver::InProgressCount() const {
  absl::MutexLock l(&mu_);
  return in_progress_count_;
}

absl::StatusOr<std::string> CpuCommDriver::NewUniqueId() {
  std::random_device rd;
  return absl::StrCat(absl::Hex(rd()), absl::Hex(rd()), "-", getpid());
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuCommDriver::InitRank(const std::string& id,
                                                                      int rank, int size,
                                                                      const CommInitOptions& o) {
  BackendOptions bo = base_;
  bo.group_name = absl::StrCat("cpucomm-", id);
  bo.rank = rank;
  bo.size = size;
  bo.rendezvous = rdzv_;
  bo.key_prefix = absl::StrCat("cpucomm/", id, "/");
  bo.bootstrap_timeout = o.timeout;
  std::unique_ptr<Backend> b = MakeCpuBackend(std::move(bo));
  absl::Status st = b->Connect();
  if (!st.ok()) {
    return base::Annotate(st, absl::StrCat("init of communicator '", o.tag, "' rank ", rank, "/",
                                           size, " on ", o.device));
  }
  Note(absl::StrCat("init ", o.tag, " rank ", rank, "/", size));
  return std::unique_ptr<Communicator>(
      new CpuCommunicator(this, id, o.tag, rank, size, std::move(b)));
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CpuCommDriver::InitRanks(
    const std::string& id, const std::vector<int>& ranks, int size,
    const std::vector<std::string>& devices, const CommInitOptions& o) {
  // Every rank's bootstrap waits for the others, so the ranks of one process connect in parallel
  // (as ncclGroupStart/End lets NCCL do).
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> got(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      CommInitOptions oi = o;
      oi.device = devices[i];
      got[i] = InitRank(id, ranks[i], size, oi);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& g : got) {
    if (!g.ok()) return g.status();
    out.push_back(std::move(*g));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuCommDriver::Split(Communicator& parent, int color,
                                                                   int key,
                                                                   const CommInitOptions& o) {
  auto& p = static_cast<CpuCommunicator&>(parent);
  RETURN_IF_ERROR(p.UsableAsParent("ncclCommSplit"));
  const int n = p.NextSplit();
  const std::string base = absl::StrCat("cpucomm/", p.id(), "/split", n, "/");
  RETURN_IF_ERROR(rdzv_->Set(absl::StrCat(base, p.rank()), absl::StrCat(color, " ", key)));
  if (color < 0) {
    Note(absl::StrCat("split ", o.tag, " not a member"));
    return nullptr;
  }
  std::vector<std::pair<int64_t, int>> order;
  for (int r = 0; r < p.size(); ++r) {
    absl::StatusOr<std::string> v = rdzv_->Get(absl::StrCat(base, r), o.timeout);
    if (!v.ok()) {
      return base::Annotate(v.status(), absl::StrCat("split '", o.tag, "': rank ", r,
                                                     " of the parent did not take part"));
    }
    std::vector<std::string> f = absl::StrSplit(*v, ' ');
    int64_t c = -1, k = 0;
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &c) || !absl::SimpleAtoi(f[1], &k)) {
      return absl::InternalError(absl::StrCat("split: bad entry '", *v, "' of rank ", r));
    }
    if (c == color) order.emplace_back(k, r);
  }
  std::sort(order.begin(), order.end());
  int new_rank = 0;
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i].second == p.rank()) new_rank = static_cast<int>(i);
  return InitRank(absl::StrCat(p.id(), ".s", n, ".c", color), new_rank,
                  static_cast<int>(order.size()), o);
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuCommDriver::Shrink(
    Communicator& parent, const std::vector<int>& excluded, const CommInitOptions& o) {
  auto& p = static_cast<CpuCommunicator&>(parent);
  RETURN_IF_ERROR(p.UsableAsParent("ncclCommShrink"));
  std::vector<int> ex = excluded;
  std::sort(ex.begin(), ex.end());
  int new_rank = p.rank();
  for (int e : ex)
    if (e < p.rank()) --new_rank;
  Note(absl::StrCat("shrink ", o.tag, " excluding ", absl::StrJoin(ex, ",")));
  return InitRank(absl::StrCat(p.id(), ".shrink", p.NextShrink(), ".x", absl::StrJoin(ex, "_")),
                  new_rank, p.size() - static_cast<int>(ex.size()), o);
}

absl::Status CpuCommDriver::GroupCollective(const std::vector<Communicator*>& comms,
                                            const std::vector<OpDesc>& ops) {
  // Each communicator runs its op on its own stream, so the ranks of one process proceed together.
  absl::Status out;
  for (size_t i = 0; i < comms.size(); ++i) {
    absl::Status s = comms[i]->Collective(ops[i]);
    if (IsInProgress(s)) {
      if (out.ok()) out = s;
    } else if (!s.ok()) {
      return s;
    }
  }
  return out;
}

std::vector<std::string> CpuCommDriver::Log() const {
  absl::MutexLock l(&mu_);
  return log_;
}
void CpuCommDriver::Note(std::string line) {
  absl::MutexLock l(&mu_);
  log_.push_back(std::move(line));
}
void CpuCommDriver::InjectAsyncError(absl::Status s) {
  absl::MutexLock l(&mu_);
  injected_ = std::move(s);
}
absl::Status CpuCommDriver::injected() const {
  absl::MutexLock l(&mu_);
  return injected_;
}

}  // namespace ember::comm
