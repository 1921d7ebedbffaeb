#include "runtime/comm/process_group.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/device_backend.h"
#include "runtime/comm/env_knobs.h"
#include "spdlog/spdlog.h"

namespace ember::comm {

struct ProcessGroup::PendingOp {
  OpDesc desc;
  bool p2p = false;
  std::string name;  // op name for messages
  size_t bytes = 0;
  std::shared_ptr<Work> work;
  uint64_t record_id = 0;
  absl::Duration timeout;
  std::atomic<int64_t> start_ns{0};
};

namespace {

int64_t NowNs() { return flight::FlightRecorder::NowNanos(); }

bool EnvTrue(const char* name) {
  const char* v = getenv(name);
  return v && (std::string(v) == "1" || std::string(v) == "true");
}

}  // namespace

absl::Status ProcessGroup::CheckAndDefault(int rank, int size, GroupOptions* options) {
  if (size < 1 || rank < 0 || rank >= size)
    return absl::InvalidArgumentError(absl::StrCat("bad rank ", rank, " / size ", size));
  if (options->backend != "cpu" && !ParseDeviceBackend(options->backend).ok())
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown backend '", options->backend, "'; use cpu, nccl, nccl-lazy or nccl-legacy"));
  if (options->name.empty() || options->name.find(' ') != std::string::npos)
    return absl::InvalidArgumentError("group name must be non-empty without spaces");
  if (EnvTrue(kEnvDisableShm)) options->enable_shm = false;
  if (options->host.empty()) {
    const char* h = getenv(kEnvHost);
    options->host = h ? h : "127.0.0.1";
  }
  if (options->dump_dir.empty()) {
    if (const char* d = getenv(kEnvFrDumpDir)) options->dump_dir = d;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(
    std::shared_ptr<Rendezvous> rdzv, int rank, int size, GroupOptions options) {
  if (!rdzv) return absl::InvalidArgumentError("no rendezvous");
  RETURN_IF_ERROR(CheckAndDefault(rank, size, &options));
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup(std::move(rdzv), rank, size, std::move(options)));
  RETURN_IF_ERROR(pg->Init(nullptr));
  return pg;
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::CreateWithBackend(
    std::shared_ptr<Rendezvous> rdzv, int rank, int size, GroupOptions options,
    std::unique_ptr<Backend> backend) {
  RETURN_IF_ERROR(CheckAndDefault(rank, size, &options));
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup(std::move(rdzv), rank, size, std::move(options)));
  RETURN_IF_ERROR(pg->Init(std::move(backend)));
  return pg;
}

ProcessGroup::ProcessGroup(std::shared_ptr<Rendezvous> rdzv, int rank, int size,
                           GroupOptions options)
    : rdzv_(std::move(rdzv)), rank_(rank), size_(size), opts_(std::move(options)) {
  prefix_ = absl::StrCat("pg/", opts_.name, "/");
  if (opts_.global_ranks.empty()) {
    opts_.global_ranks.resize(size_);
    std::iota(opts_.global_ranks.begin(), opts_.global_ranks.end(), 0);
  }
  if (opts_.global_rank < 0) opts_.global_rank = opts_.global_ranks[rank_];
}

BackendOptions ProcessGroup::MakeBackendOptions(int rank, int size, const std::string& name) const {
  BackendOptions bo;
  bo.group_name = name;
  bo.rank = rank;
  bo.size = size;
  bo.rendezvous = rdzv_;
  bo.key_prefix = absl::StrCat("pg/", name, "/");
  bo.bootstrap_timeout = opts_.bootstrap_timeout;
  bo.enable_shm = opts_.enable_shm;
  bo.host = opts_.host;
  bo.shm_ring_bytes = opts_.shm_ring_bytes;
  bo.small_bytes = opts_.small_bytes;
  bo.device = opts_.device;
  bo.backend = opts_.backend;
  bo.comm_driver = opts_.comm_driver;
  bo.op_timeout = opts_.timeout;
  return bo;
}

absl::Status ProcessGroup::Init(std::unique_ptr<Backend> given) {
  if (opts_.recorder) {
    flight::GroupInfo g;
    g.name = opts_.name;
    g.rank = rank_;
    g.size = size_;
    g.global_rank = opts_.global_rank;
    g.global_ranks = opts_.global_ranks;
    g.backend = opts_.backend;
    fr_group_ = opts_.recorder->RegisterGroup(std::move(g));
  }
  if (given) {
    backend_ = std::move(given);
    absl::MutexLock l(&connect_mu_);
    connected_ = true;
    connected_fast_.store(true, std::memory_order_release);
  } else if (opts_.backend == "cpu") {
    backend_ = MakeCpuBackend(MakeBackendOptions(rank_, size_, opts_.name));
  } else {
    ASSIGN_OR_RETURN(backend_, MakeDeviceBackend(MakeBackendOptions(rank_, size_, opts_.name)));
  }
  // Device backends decide themselves when communicators are created (Connect may do nothing).
  if (!opts_.lazy_init || opts_.backend != "cpu") RETURN_IF_ERROR(EnsureConnected());
  executor_ = std::thread([this] { ExecutorLoop(); });
  watchdog_ = std::thread([this] { WatchdogLoop(); });
  return absl::OkStatus();
}

ProcessGroup::~ProcessGroup() {
  bool busy;
  {
    absl::MutexLock l(&mu_);
    busy = running_ != nullptr || !queue_.empty();
    for (auto& op : p2p_pending_)
      if (!op->work->IsCompleted()) busy = true;
  }
  if (busy) Abort("process group destroyed with ops still pending");
  stop_ = true;
  {
    absl::MutexLock l(&mu_);
    cv_.SignalAll();
  }
  if (executor_.joinable()) executor_.join();
  if (watchdog_.joinable()) watchdog_.join();
  backend_.reset();
}

std::string ProcessGroup::Describe() const {
  return absl::StrCat("group '", opts_.name, "' rank ", rank_, "/", size_, " (",
                      backend_ ? backend_->Describe() : "", ")");
}

absl::Status ProcessGroup::EnsureConnected() {
  if (connected_fast_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock l(&connect_mu_);
  if (connected_) return absl::OkStatus();
  absl::Status st = backend_->Connect();
  if (!st.ok()) return base::Annotate(st, absl::StrCat("connecting group '", opts_.name, "'"));
  connected_ = true;
  connected_fast_.store(true, std::memory_order_release);
  if (opts_.recorder) {
    opts_.recorder->SetGroupMemory(fr_group_, static_cast<int64_t>(backend_->MemoryBytes()));
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> ProcessGroup::Submit(OpDesc desc, size_t bytes, OpOptions o) {
  if ((desc.type == OpType::kAllReduce || desc.type == OpType::kReduceScatter) &&
      !IsReducible(desc.dtype)) {
    auto w = std::make_shared<Work>(OpTypeName(desc.type), 0);
    w->Finish(absl::InvalidArgumentError(absl::StrCat(
        OpTypeName(desc.type), ": cannot reduce dtype ", DTypeName(desc.dtype),
        "; use one of f32, bf16, f16, f64, i32, i64, u8")));
    return w;
  }
  auto op = std::make_shared<PendingOp>();
  op->desc = desc;
  op->desc.stream = CurrentStream();  // device ops wait on the submitter's stream
  op->name = OpTypeName(desc.type);
  op->bytes = bytes;
  op->timeout = o.timeout > absl::ZeroDuration() ? o.timeout : opts_.timeout;
  op->desc.timeout = op->timeout;
  bool run_inline = false;
  absl::Status fail;
  {
    absl::MutexLock l(&mu_);
    op->desc.seq = ++next_seq_;
    op->work = std::make_shared<Work>(op->name, op->desc.seq);
    if (opts_.recorder) {
      size_t in_numel = desc.count, out_numel = desc.count;
      if (desc.type == OpType::kAllGather) out_numel *= size_;
      if (desc.type == OpType::kReduceScatter) in_numel *= size_;
      if (desc.type == OpType::kAllToAll) in_numel = out_numel = desc.count * size_;
      flight::OpRecord r;
      r.group_id = fr_group_;
      r.collective_seq = op->desc.seq;
      r.op = op->name;
      r.in_numel = static_cast<int64_t>(in_numel);
      r.out_numel = static_cast<int64_t>(out_numel);
      r.in_dtype = r.out_dtype = DTypeName(desc.dtype);
      r.peer = desc.type == OpType::kBroadcast ? desc.root : -1;
      r.timeout_ms = absl::ToInt64Milliseconds(op->timeout);
      r.tag = o.tag;
      op->record_id = opts_.recorder->Record(r);
    }
    if (aborted_) {
      fail = absl::AbortedError(absl::StrCat("group '", opts_.name, "' was aborted: ",
                                             abort_status_.message()));
    } else if (queue_.empty() && running_ == nullptr && bytes <= opts_.inline_max_bytes &&
               connected_fast_.load(std::memory_order_acquire)) {
      run_inline = true;
      running_ = op;
    } else {
      queue_.push_back(op);
      cv_.SignalAll();
    }
  }
  if (!fail.ok()) {
    if (opts_.recorder) opts_.recorder->Fail(op->record_id, fail.message());
    op->work->Finish(fail);
    return op->work;
  }
  if (run_inline) {
    Execute(op.get());
    absl::MutexLock l(&mu_);
    running_ = nullptr;
    if (!queue_.empty()) cv_.SignalAll();
  }
  return op->work;
}

void ProcessGroup::Execute(PendingOp* op) {
  op->start_ns.store(NowNs(), std::memory_order_release);
  if (opts_.recorder) opts_.recorder->Start(op->record_id);
  absl::Status st = EnsureConnected();
  if (st.ok()) st = backend_->Run(op->desc);
  if (st.ok()) {
    if (std::shared_ptr<DeviceEvents> ev = backend_->TakeOpEvents()) {
      op->work->SetDeviceEvents(ev);
      // The watchdog copies the device times into the recorder once the events completed.
      absl::MutexLock l(&mu_);
      if (opts_.recorder && device_timed_.size() < 4096) device_timed_.emplace_back(op->record_id, ev);
    }
  }
  if (!st.ok()) {
    // The byte streams are now in an unknown state: abort so peers fail fast too.
    Abort(st.message());
    absl::MutexLock l(&mu_);
    if (absl::IsDeadlineExceeded(abort_status_)) st = abort_status_;  // the watchdog's message
  }
  if (opts_.recorder) {
    if (st.ok()) {
      opts_.recorder->Complete(op->record_id);
    } else {
      opts_.recorder->Fail(op->record_id, st.message());
    }
  }
  {
    absl::MutexLock l(&mu_);
    if (st.ok()) last_completed_seq_ = std::max(last_completed_seq_, op->desc.seq);
  }
  op->work->Finish(st);
}

void ProcessGroup::ExecutorLoop() {
  while (true) {
    std::shared_ptr<PendingOp> op;
    {
      absl::MutexLock l(&mu_);
      while (!stop_ && (queue_.empty() || running_ != nullptr)) cv_.Wait(&mu_);
      if (stop_ && (queue_.empty() || running_ != nullptr)) return;
      op = queue_.front();
      queue_.pop_front();
      running_ = op;
    }
    Execute(op.get());
    absl::MutexLock l(&mu_);
    running_ = nullptr;
    cv_.SignalAll();
  }
}

void ProcessGroup::Abort(absl::string_view why) {
  std::deque<std::shared_ptr<PendingOp>> queued;
  absl::Status st;
  {
    absl::MutexLock l(&mu_);
    if (aborted_) return;
    aborted_ = true;
    // Keep the watchdog's DEADLINE_EXCEEDED code when it is the cause.
    abort_status_ = absl::AbortedError(why);
    queued.swap(queue_);
    st = abort_status_;
    cv_.SignalAll();
  }
  spdlog::error("comm: aborting {}: {}", Describe(), std::string(why));
  backend_->Abort(st);
  for (auto& op : queued) {
    absl::Status s = absl::AbortedError(
        absl::StrCat(op->name, " (seq ", op->desc.seq, ") not run: group '", opts_.name,
                     "' aborted: ", why));
    if (opts_.recorder) opts_.recorder->Fail(op->record_id, s.message());
    op->work->Finish(s);
  }
}

std::shared_ptr<Work> ProcessGroup::SubmitP2P(bool send, void* data, size_t count, DataType t,
                                              int peer, int tag, OpOptions o) {
  auto op = std::make_shared<PendingOp>();
  op->p2p = true;
  op->name = send ? "send" : "recv";
  op->bytes = count * DTypeSize(t);
  op->timeout = o.timeout > absl::ZeroDuration() ? o.timeout : opts_.timeout;
  op->desc.timeout = op->timeout;
  int64_t seq = ++p2p_seq_;
  op->desc.seq = seq;
  op->desc.root = peer;
  op->work = std::make_shared<Work>(op->name, seq);
  flight::FlightRecorder* fr = opts_.recorder;
  if (fr) {
    flight::OpRecord r;
    r.group_id = fr_group_;
    r.p2p_seq = seq;
    r.op = op->name;
    r.in_numel = r.out_numel = static_cast<int64_t>(count);
    r.in_dtype = r.out_dtype = DTypeName(t);
    r.peer = peer;
    r.timeout_ms = absl::ToInt64Milliseconds(op->timeout);
    r.tag = o.tag.empty() ? absl::StrCat("tag=", tag) : o.tag;
    op->record_id = fr->Record(r);
  }
  absl::Status fail;
  if (peer < 0 || peer >= size_ || peer == rank_) {
    fail = absl::InvalidArgumentError(absl::StrCat(op->name, ": bad peer rank ", peer, " in group '",
                                                   opts_.name, "' of size ", size_));
  } else {
    fail = EnsureConnected();
  }
  if (fail.ok()) {
    absl::MutexLock l(&mu_);
    if (aborted_) fail = absl::AbortedError(absl::StrCat("group '", opts_.name, "' was aborted: ",
                                                         abort_status_.message()));
    else p2p_pending_.push_back(op);
  }
  if (!fail.ok()) {
    if (fr) fr->Fail(op->record_id, fail.message());
    op->work->Finish(fail);
    return op->work;
  }
  op->start_ns.store(NowNs());
  if (fr) fr->Start(op->record_id);
  auto done = [op, fr](absl::Status s) {
    if (fr) {
      if (s.ok()) fr->Complete(op->record_id);
      else fr->Fail(op->record_id, s.message());
    }
    op->work->Finish(std::move(s));
  };
  if (send) {
    backend_->PostSend(data, op->bytes, peer, tag, std::move(done));
  } else {
    backend_->PostRecv(data, op->bytes, peer, tag, std::move(done));
  }
  return op->work;
}

// --- public ops -------------------------------------------------------------------------------

std::shared_ptr<Work> ProcessGroup::AllReduce(void* buf, size_t count, DataType t, ReduceOp op,
                                              OpOptions o) {
  OpDesc d;
  d.type = OpType::kAllReduce;
  d.out = buf;
  d.count = count;
  d.dtype = t;
  d.reduce = op;
  return Submit(d, count * DTypeSize(t), std::move(o));
}

std::shared_ptr<Work> ProcessGroup::Broadcast(void* buf, size_t count, DataType t, int root,
                                              OpOptions o) {
  OpDesc d;
  d.type = OpType::kBroadcast;
  d.out = buf;
  d.count = count;
  d.dtype = t;
  d.root = root;
  if (root < 0 || root >= size_) {
    auto w = std::make_shared<Work>("broadcast", 0);
    w->Finish(absl::InvalidArgumentError(absl::StrCat("broadcast: bad root ", root)));
    return w;
  }
  return Submit(d, count * DTypeSize(t), std::move(o));
}

std::shared_ptr<Work> ProcessGroup::AllGatherSingle(const void* in, void* out, size_t count,
                                                    DataType t, OpOptions o) {
  OpDesc d;
  d.type = OpType::kAllGather;
  d.in = in;
  d.out = out;
  d.count = count;
  d.dtype = t;
  return Submit(d, count * size_ * DTypeSize(t), std::move(o));
}

std::shared_ptr<Work> ProcessGroup::ReduceScatterSingle(const void* in, void* out, size_t count,
                                                        DataType t, ReduceOp op, OpOptions o) {
  OpDesc d;
  d.type = OpType::kReduceScatter;
  d.in = in;
  d.out = out;
  d.count = count;
  d.dtype = t;
  d.reduce = op;
  return Submit(d, count * size_ * DTypeSize(t), std::move(o));
}

std::shared_ptr<Work> ProcessGroup::AllToAllSingle(const void* in, void* out, size_t count,
                                                   DataType t, OpOptions o) {
  OpDesc d;
  d.type = OpType::kAllToAll;
  d.in = in;
  d.out = out;
  d.count = count;
  d.dtype = t;
  return Submit(d, count * size_ * DTypeSize(t), std::move(o));
}

std::shared_ptr<Work> ProcessGroup::Barrier(OpOptions o) {
  OpDesc d;
  d.type = OpType::kBarrier;
  d.dtype = DataType::kU8;
  return Submit(d, 1, std::move(o));
}

std::shared_ptr<Work> ProcessGroup::Send(const void* data, size_t count, DataType t, int dst,
                                         int tag, OpOptions o) {
  return SubmitP2P(true, const_cast<void*>(data), count, t, dst, tag, std::move(o));
}

std::shared_ptr<Work> ProcessGroup::Recv(void* data, size_t count, DataType t, int src, int tag,
                                         OpOptions o) {
  return SubmitP2P(false, data, count, t, src, tag, std::move(o));
}

// --- watchdog and dumps -----------------------------------------------------------------------

std::string ProcessGroup::DumpPath() const {
  if (opts_.dump_dir.empty()) return "";
  return absl::StrCat(opts_.dump_dir, "/rank-", DumpRank(), ".json");
}

absl::Status ProcessGroup::DumpFlightRecorder(const std::string& path) {
  if (!opts_.recorder) return absl::FailedPreconditionError("group has no flight recorder");
  std::string p = path.empty() ? DumpPath() : path;
  if (p.empty()) return absl::FailedPreconditionError("no dump_dir configured");
  return opts_.recorder->DumpToFile(p, "api", DumpRank());
}

void ProcessGroup::DumpIfRequested(const std::string& key, const std::string& reason) {
  if (!opts_.recorder) return;
  std::string path = DumpPath();
  if (path.empty()) return;
  if (!opts_.recorder->ClaimDump(key)) return;
  absl::Status st = opts_.recorder->DumpToFile(path, reason, DumpRank());
  if (st.ok()) {
    spdlog::warn("comm: flight recorder dumped to {} ({})", path, reason);
  } else {
    spdlog::error("comm: flight recorder dump failed: {}", st.ToString());
  }
}

void ProcessGroup::OnTimeout(const std::string& message) {
  spdlog::error("comm: {}", message);
  {
    absl::MutexLock l(&mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_status_ = absl::DeadlineExceededError(message);
  }
  // Undo the early-out in Abort: we set aborted_ ourselves to keep the DEADLINE_EXCEEDED code.
  std::deque<std::shared_ptr<PendingOp>> queued;
  std::vector<std::shared_ptr<PendingOp>> p2p;
  {
    absl::MutexLock l(&mu_);
    queued.swap(queue_);
    p2p = p2p_pending_;
    cv_.SignalAll();
  }
  absl::Status st = absl::DeadlineExceededError(message);
  // Fail p2p works that timed out with the watchdog's message before the backend aborts them.
  int64_t now = NowNs();
  for (auto& op : p2p) {
    int64_t s = op->start_ns.load();
    if (s > 0 && now - s > absl::ToInt64Nanoseconds(op->timeout) && op->work->Finish(st)) {
      if (opts_.recorder) opts_.recorder->Fail(op->record_id, message);
    }
  }
  backend_->Abort(st);
  for (auto& op : queued) {
    absl::Status s = absl::AbortedError(absl::StrCat(op->name, " (seq ", op->desc.seq,
                                                     ") not run: ", message));
    if (opts_.recorder) opts_.recorder->Fail(op->record_id, s.message());
    op->work->Finish(s);
  }
  std::string request = absl::StrCat("group ", opts_.name, " rank ", rank_, " time ", NowNs());
  absl::Status set = rdzv_->Set(std::string(kDumpRequestKey), request);
  if (!set.ok()) spdlog::error("comm: cannot set {}: {}", std::string(kDumpRequestKey), set.ToString());
  DumpIfRequested(absl::StrCat("request:", request), "timeout: " + message);
}

void ProcessGroup::RecordDeviceTimes() {
  std::vector<std::pair<uint64_t, std::shared_ptr<DeviceEvents>>> pending;
  {
    absl::MutexLock l(&mu_);
    if (device_timed_.empty()) return;
    pending.swap(device_timed_);
  }
  std::vector<std::pair<uint64_t, std::shared_ptr<DeviceEvents>>> keep;
  for (auto& [id, ev] : pending) {
    int64_t s = 0, e = 0;
    if (ev->TimesNs(&s, &e)) {
      opts_.recorder->SetDeviceTimes(id, s, e);
    } else {
      keep.emplace_back(id, std::move(ev));
    }
  }
  absl::MutexLock l(&mu_);
  device_timed_.insert(device_timed_.begin(), keep.begin(), keep.end());
}

void ProcessGroup::WatchdogLoop() {
  last_signal_count_ = flight::DumpSignalCount();
  absl::Time next_poll = absl::Now();
  while (!stop_) {
    {
      absl::MutexLock l(&mu_);
      bool (*stopped)(std::atomic<bool>*) = [](std::atomic<bool>* s) { return s->load(); };
      mu_.AwaitWithTimeout(absl::Condition(stopped, &stop_), opts_.watchdog_period);
    }
    if (stop_) break;
    // Device backends create communicators lazily (nccl-lazy, nccl-legacy): keep the dump's
    // per-group memory current.
    if (opts_.recorder && connected_fast_.load(std::memory_order_acquire)) {
      opts_.recorder->SetGroupMemory(fr_group_, static_cast<int64_t>(backend_->MemoryBytes()));
    }
    int64_t now = NowNs();
    std::string timeout_msg;
    {
      absl::MutexLock l(&mu_);
      if (!aborted_ && running_ != nullptr) {
        PendingOp* op = running_.get();
        int64_t s = op->start_ns.load();
        if (s > 0 && now - s > absl::ToInt64Nanoseconds(op->timeout)) {
          timeout_msg = absl::StrCat(
              "watchdog: ", op->name, " (seq ", op->desc.seq, ", ", op->desc.count, " x ",
              DTypeName(op->desc.dtype), ", ", op->bytes, " bytes) in group '", opts_.name,
              "' rank ", rank_, "/", size_, " timed out after ",
              absl::FormatDuration(op->timeout), "; last enqueued seq ", next_seq_,
              ", last completed seq ", last_completed_seq_);
        }
      }
      std::vector<std::shared_ptr<PendingOp>> keep;
      for (auto& op : p2p_pending_) {
        if (op->work->IsCompleted()) continue;
        keep.push_back(op);
        int64_t s = op->start_ns.load();
        if (!aborted_ && timeout_msg.empty() && s > 0 &&
            now - s > absl::ToInt64Nanoseconds(op->timeout)) {
          timeout_msg = absl::StrCat("watchdog: ", op->name, " (p2p seq ", op->desc.seq,
                                     ", peer ", op->desc.root, ", ", op->bytes,
                                     " bytes) in group '", opts_.name, "' rank ", rank_, "/",
                                     size_, " timed out after ", absl::FormatDuration(op->timeout));
        }
      }
      p2p_pending_.swap(keep);
    }
    if (!timeout_msg.empty()) OnTimeout(timeout_msg);
    RecordDeviceTimes();
    if (!aborted_) {
      // Device backends: the library's async error, another group's abort, or a device op past its
      // deadline (cpu: always OK).
      absl::Status async = backend_->AsyncError();
      if (absl::IsDeadlineExceeded(async)) {
        OnTimeout(std::string(async.message()));
      } else if (!async.ok()) {
        Abort(async.message());
      }
    }
    uint64_t sig = flight::DumpSignalCount();
    if (sig != last_signal_count_) {
      last_signal_count_ = sig;
      DumpIfRequested(absl::StrCat("signal:", sig), "signal");
    }
    if (absl::Now() >= next_poll) {
      next_poll = absl::Now() + opts_.dump_poll_period;
      absl::StatusOr<std::string> req = rdzv_->TryGet(std::string(kDumpRequestKey));
      if (req.ok()) DumpIfRequested(absl::StrCat("request:", *req), "request: " + *req);
    }
  }
}

}  // namespace ember::comm
