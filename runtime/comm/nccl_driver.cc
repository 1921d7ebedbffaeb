// The NCCL CommDriver (comm_driver.h), device builds only (EMBER_WITH_NCCL). Library calls only:
// the policy (when, which communicator, what to abort together) is device_backend.cc's.
//
// - Communicators are created non-blocking (ncclConfig_t::blocking = 0) and polled with
//   ncclCommGetAsyncError until ready; past the timeout the new handle is aborted
//   (DEADLINE_EXCEEDED). ncclCommSplit and ncclCommShrink go the same way; a failed split or
//   shrink never aborts the parent (its owner frees it, once).
// - Calls on a ready communicator return ncclInProgress as InProgressError (comm_driver.h); the
//   policy polls AsyncError until OK and only then calls EndOp, which records the end event.
// - Revoke is ncclCommRevoke (NCCL >= 2.28; the handle stays valid); Abort is ncclCommAbort (the
//   handle is freed). The destructor destroys a revoked communicator once quiescent (finalize is
//   invalid after revoke), finalizes and destroys a healthy one, and aborts otherwise.
// - Each communicator has its own non-blocking stream; an op first makes that stream wait on the
//   submitter's stream (OpDesc::stream), records start/end CUDA events around the op, and the
//   Work waits on the end event (CudaEvents). Under CUDA graph capture of the submitter's stream
//   the op joins the capture (the submitter's stream waits on the op at once; no timing events).
// - Memory: the drop in cudaMemGetInfo's free bytes across the init (NCCL's buffers live outside
//   any allocator; approximate when other threads allocate meanwhile).
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/comm_driver.h"
#include "runtime/comm/nccl_internal.h"
#include "runtime/flight/recorder.h"
#include "spdlog/spdlog.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
#define EMBER_NCCL_NO_SHRINK 1
#endif
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 0)
#define EMBER_NCCL_NO_REVOKE 1
#endif

namespace ember::comm {
namespace {

using nccl_internal::CudaEvents;
using nccl_internal::CudaStatus;

// ncclInProgress is not done: it becomes InProgressError, which the caller must complete by
// polling ncclCommGetAsyncError (the policy's Complete, or WaitReady for inits).
absl::Status NcclStatus(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return absl::OkStatus();
  if (r == ncclInProgress) return InProgressError(what);
  const char* last = comm ? ncclGetLastError(comm) : "";
  return absl::InternalError(absl::StrCat("NCCL ", ncclGetErrorString(r), " in ", what,
                                          last && *last ? absl::StrCat(": ", last) : ""));
}

absl::StatusOr<ncclDataType_t> NcclType(DataType t) {
  switch (t) {
    case DataType::kF32: return ncclFloat32;
    case DataType::kBF16: return ncclBfloat16;
    case DataType::kF16: return ncclFloat16;
    case DataType::kF64: return ncclFloat64;
    case DataType::kI32: return ncclInt32;
    case DataType::kI64: return ncclInt64;
    case DataType::kU8: return ncclUint8;
    default:
      return absl::InvalidArgumentError(absl::StrCat("dtype ", DTypeName(t), " has no NCCL type"));
  }
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kProduct: return ncclProd;
  }
  return ncclSum;
}

ncclConfig_t NonBlocking(const std::string& tag) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  c.commName = nullptr;
  (void)tag;
  return c;
}

// A management call (init, split, shrink, group end) that WaitReady completes next.
absl::Status Issued(absl::Status s) { return IsInProgress(s) ? absl::OkStatus() : s; }

// Polls a non-blocking communicator until it is ready. Never aborts: on failure the caller aborts
// the handle it owns (a new one), so no handle is aborted twice.
absl::Status WaitReady(ncclComm_t comm, absl::Duration timeout, const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclStatus(r, "ncclCommGetAsyncError", comm);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclStatus(state, what.c_str(), comm);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, " not ready after ", absl::FormatDuration(timeout),
          " (a rank did not take part, or the network is unreachable)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool WaitFinalized(ncclComm_t comm, absl::Duration budget) {
  const absl::Time deadline = absl::Now() + budget;
  while (absl::Now() < deadline) {
    ncclResult_t state = ncclInProgress;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
    if (state == ncclSuccess) return true;
    if (state != ncclInProgress) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

size_t FreeBytes(int device) {
  size_t free_b = 0, total = 0;
  cudaSetDevice(device);
  cudaMemGetInfo(&free_b, &total);
  return free_b;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, int rank, int size, std::string tag,
                   size_t mem_bytes)
      : comm_(comm), device_(device), rank_(rank), size_(size), tag_(std::move(tag)),
        mem_bytes_(mem_bytes) {}

  // Creates the stream and the reference event; call once after construction.
  absl::Status Setup() {
    cudaSetDevice(device_);
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags"));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&ref_), "cudaEventCreate(ref)"));
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(ref_, stream_), "cudaEventRecord(ref)"));
    RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(ref_), "cudaEventSynchronize(ref)"));
    ref_host_ns_ = flight::FlightRecorder::NowNanos();
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&scratch_, 16), "cudaMalloc(barrier scratch)"));
    return absl::OkStatus();
  }

  ~NcclCommunicator() override {
    // The last reference: no other thread can be inside a call on comm_ now.
    if (!freed_.load()) {
      bool destroyed = false;
      if (revoked_.load()) {
        // Finalize is invalid after revoke; destroy once quiescent, abort if it never is.
        if (WaitFinalized(comm_, absl::Seconds(10))) destroyed = ncclCommDestroy(comm_) == ncclSuccess;
      } else {
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comm_, &state);
        // Non-blocking communicators: finalize and poll (bounded), then destroy; abort otherwise.
        const bool finalized = state == ncclSuccess &&
                               ncclCommFinalize(comm_) != ncclInternalError &&
                               WaitFinalized(comm_, absl::Seconds(10));
        if (finalized) destroyed = ncclCommDestroy(comm_) == ncclSuccess;
      }
      if (!destroyed) ncclCommAbort(comm_);
    }
    cudaSetDevice(device_);
    if (scratch_) cudaFree(scratch_);
    if (ref_) cudaEventDestroy(ref_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  ncclComm_t comm() const { return comm_; }
  int device() const { return device_; }

  absl::Status Collective(const OpDesc& op) override {
    if (freed_.load()) return absl::InternalError(absl::StrCat("communicator ", tag_, " was freed"));
    if (revoked_.load()) return absl::AbortedError(absl::StrCat("communicator ", tag_, " revoked"));
    cudaSetDevice(device_);
    cudaStream_t caller = static_cast<cudaStream_t>(op.stream);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    RETURN_IF_ERROR(CudaStatus(cudaStreamIsCapturing(caller, &capture), "cudaStreamIsCapturing"));
    capturing_ = capture == cudaStreamCaptureStatusActive;
    pending_ev_.reset();
    RETURN_IF_ERROR(Join(stream_, caller));  // the op's inputs come from the caller's stream
    if (!capturing_) {
      ASSIGN_OR_RETURN(pending_ev_, CudaEvents::Start(device_, stream_, ref_, ref_host_ns_));
    }
    return Enqueue(op);  // may be in progress: the policy polls before EndOp
  }

  absl::StatusOr<std::shared_ptr<DeviceEvents>> EndOp(void* caller, bool p2p) override {
    cudaSetDevice(device_);
    cudaStream_t c = static_cast<cudaStream_t>(caller);
    if (p2p || capturing_) {
      // p2p: no events; the submitter's stream waits on the op at once, so work it enqueues after
      // the Work completed sees the received bytes. Capture: rejoin it; no timing events. (p2p
      // leaves capturing_, a collective's, alone.)
      if (!p2p) capturing_ = false;
      RETURN_IF_ERROR(Join(c, stream_));
      return std::shared_ptr<DeviceEvents>();
    }
    if (pending_ev_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("EndOp on ", tag_, " without an op"));
    }
    std::shared_ptr<CudaEvents> ev = std::move(pending_ev_);
    RETURN_IF_ERROR(ev->RecordEnd(stream_));
    return std::shared_ptr<DeviceEvents>(std::move(ev));
  }

  void PostSend(const void* data, size_t bytes, int peer, int tag,
                std::function<void(absl::Status)> done) override {
    done(P2P(true, const_cast<void*>(data), bytes, peer));
  }
  void PostRecv(void* data, size_t bytes, int peer, int tag,
                std::function<void(absl::Status)> done) override {
    done(P2P(false, data, bytes, peer));
  }

  absl::Status AsyncError() override {
    if (freed_.load()) return absl::OkStatus();  // the policy reports the abort itself
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return NcclStatus(r, "ncclCommGetAsyncError", comm_);
    return NcclStatus(state, "communicator (async error)", comm_);
  }

  void Revoke(const absl::Status& why) override {
#ifdef EMBER_NCCL_NO_REVOKE
    Abort(why);  // NCCL < 2.28: no revoke; the handle is freed (Shrink after it is refused)
#else
    if (freed_.load() || revoked_.exchange(true)) return;
    spdlog::warn("comm: ncclCommRevoke({}): {}", tag_, why.ToString());
    ncclCommRevoke(comm_, NCCL_REVOKE_DEFAULT);
#endif
  }

  void Abort(const absl::Status& why) override {
    if (freed_.exchange(true)) return;
    spdlog::warn("comm: ncclCommAbort({}): {}", tag_, why.ToString());
    ncclCommAbort(comm_);
  }
  bool freed() const { return freed_.load(); }
  bool revoked() const { return revoked_.load(); }

  size_t MemoryBytes() const override { return mem_bytes_; }
  std::string Describe() const override {
    return absl::StrCat(tag_, " rank ", rank_, "/", size_, " on cuda:", device_);
  }

 private:
  // `waiter` waits for what is enqueued on `on` so far.
  absl::Status Join(cudaStream_t waiter, cudaStream_t on) {
    cudaEvent_t e;
    RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                               "cudaEventCreateWithFlags"));
    absl::Status s = CudaStatus(cudaEventRecord(e, on), "cudaEventRecord(join)");
    if (s.ok()) s = CudaStatus(cudaStreamWaitEvent(waiter, e, 0), "cudaStreamWaitEvent(join)");
    cudaEventDestroy(e);
    return s;
  }

  absl::Status Enqueue(const OpDesc& op) {
    if (op.type == OpType::kBarrier) {
      return NcclStatus(ncclAllReduce(scratch_, scratch_, 1, ncclUint8, ncclSum, comm_, stream_),
                        "ncclAllReduce(barrier)", comm_);
    }
    ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(op.dtype));
    const ncclRedOp_t r = NcclOp(op.reduce);
    switch (op.type) {
      case OpType::kAllReduce:
        return NcclStatus(ncclAllReduce(op.out, op.out, op.count, t, r, comm_, stream_),
                          "ncclAllReduce", comm_);
      case OpType::kBroadcast:
        return NcclStatus(ncclBroadcast(op.out, op.out, op.count, t, op.root, comm_, stream_),
                          "ncclBroadcast", comm_);
      case OpType::kAllGather:
        return NcclStatus(ncclAllGather(op.in, op.out, op.count, t, comm_, stream_),
                          "ncclAllGather", comm_);
      case OpType::kReduceScatter:
        return NcclStatus(ncclReduceScatter(op.in, op.out, op.count, t, r, comm_, stream_),
                          "ncclReduceScatter", comm_);
      case OpType::kAllToAll:
        return NcclStatus(ncclAlltoAll(op.in, op.out, op.count, t, comm_, stream_),
                          "ncclAlltoAll", comm_);
      default:
        return absl::UnimplementedError(
            absl::StrCat(OpTypeName(op.type), " is not a collective of the nccl driver"));
    }
  }

  absl::Status P2P(bool send, void* data, size_t bytes, int peer) {
    if (freed_.load()) return absl::InternalError(absl::StrCat("communicator ", tag_, " was freed"));
    if (revoked_.load()) return absl::AbortedError(absl::StrCat("communicator ", tag_, " revoked"));
    cudaSetDevice(device_);
    cudaStream_t caller = static_cast<cudaStream_t>(CurrentStream());
    RETURN_IF_ERROR(Join(stream_, caller));
    ncclResult_t r = send ? ncclSend(data, bytes, ncclUint8, peer, comm_, stream_)
                          : ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_);
    return NcclStatus(r, send ? "ncclSend" : "ncclRecv", comm_);  // then EndOp(p2p) joins
  }

  const ncclComm_t comm_;
  const int device_, rank_, size_;
  const std::string tag_;
  const size_t mem_bytes_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ref_ = nullptr;
  int64_t ref_host_ns_ = 0;
  void* scratch_ = nullptr;
  std::atomic<bool> freed_{false}, revoked_{false};
  bool capturing_ = false;                  // of the last Collective (one caller at a time)
  std::shared_ptr<CudaEvents> pending_ev_;  // its start event, until EndOp
};

class NcclDriver : public CommDriver {
 public:
  std::string name() const override {
    int v = 0;
    ncclGetVersion(&v);
    return absl::StrCat("nccl ", v / 10000, ".", (v / 100) % 100, ".", v % 100);
  }

  absl::StatusOr<std::string> NewUniqueId() override {
    ncclUniqueId id;
    RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    return std::string(id.internal, sizeof(id.internal));
  }

  absl::StatusOr<std::unique_ptr<Communicator>> InitRank(const std::string& id, int rank, int size,
                                                         const CommInitOptions& o) override {
    ASSIGN_OR_RETURN(auto v, InitRanks(id, {rank}, size, {o.device}, o));
    return std::move(v[0]);
  }

  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> InitRanks(
      const std::string& id, const std::vector<int>& ranks, int size,
      const std::vector<std::string>& devices, const CommInitOptions& o) override {
    ncclUniqueId uid;
    if (id.size() != sizeof(uid.internal)) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL unique id of ", id.size(), " bytes, want ",
                                                     sizeof(uid.internal)));
    }
    std::memcpy(uid.internal, id.data(), id.size());
    std::vector<int> ords;
    std::vector<size_t> free_before;
    for (const std::string& d : devices) {
      ASSIGN_OR_RETURN(int ord, nccl_internal::CheckCudaDevice(d));
      ords.push_back(ord);
      free_before.push_back(FreeBytes(ord));
    }
    std::vector<ncclComm_t> comms(ranks.size(), nullptr);
    ncclConfig_t cfg = NonBlocking(o.tag);
    absl::Status st = NcclStatus(ncclGroupStart(), "ncclGroupStart");
    for (size_t i = 0; st.ok() && i < ranks.size(); ++i) {
      cudaSetDevice(ords[i]);
      st = Issued(NcclStatus(ncclCommInitRankConfig(&comms[i], size, uid, ranks[i], &cfg),
                             "ncclCommInitRankConfig"));
    }
    absl::Status end = Issued(NcclStatus(ncclGroupEnd(), "ncclGroupEnd"));
    if (st.ok()) st = end;
    for (size_t i = 0; st.ok() && i < comms.size(); ++i) {
      if (comms[i] == nullptr) continue;
      st = WaitReady(comms[i], o.timeout, absl::StrCat("ncclCommInitRankConfig(", o.tag, " rank ",
                                                       ranks[i], "/", size, ")"));
    }
    if (!st.ok()) {
      for (ncclComm_t c : comms)
        if (c != nullptr) ncclCommAbort(c);  // each new handle once; none is wrapped yet
      return st;
    }
    std::vector<std::unique_ptr<Communicator>> out;
    for (size_t i = 0; i < comms.size(); ++i) {
      out.push_back(Wrap(comms[i], ords[i], ranks[i], size, o.tag, free_before[i]));
    }
    for (auto& c : out) RETURN_IF_ERROR(static_cast<NcclCommunicator&>(*c).Setup());
    return out;
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(Communicator& parent, int color, int key,
                                                      const CommInitOptions& o) override {
    auto& p = static_cast<NcclCommunicator&>(parent);
    cudaSetDevice(p.device());
    const size_t before = FreeBytes(p.device());
    ncclConfig_t cfg = NonBlocking(o.tag);
    if (p.freed()) return absl::FailedPreconditionError("ncclCommSplit of a freed communicator");
    ncclComm_t c = nullptr;
    RETURN_IF_ERROR(Issued(NcclStatus(
        ncclCommSplit(p.comm(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c, &cfg),
        "ncclCommSplit", p.comm())));
    // The child first (aborted here on failure: it is ours), then the parent, which is only
    // waited for: on failure its owner revokes and frees it, once (aborting it here too freed it
    // twice: once here and once in its destructor).
    absl::StatusOr<std::unique_ptr<Communicator>> child = nullptr;
    if (color >= 0 && c != nullptr) child = Ready(c, p.device(), o, before, "ncclCommSplit child");
    RETURN_IF_ERROR(WaitReady(p.comm(), o.timeout, absl::StrCat("ncclCommSplit(", o.tag, ")")));
    return child;
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(Communicator& parent,
                                                       const std::vector<int>& excluded,
                                                       const CommInitOptions& o) override {
#ifdef EMBER_NCCL_NO_SHRINK
    return absl::UnimplementedError("ncclCommShrink needs NCCL >= 2.27; this build has an older NCCL");
#else
    auto& p = static_cast<NcclCommunicator&>(parent);
    cudaSetDevice(p.device());
    const size_t before = FreeBytes(p.device());
    ncclConfig_t cfg = NonBlocking(o.tag);
    std::vector<int> ex = excluded;
    ncclComm_t c = nullptr;
    // A freed parent cannot shrink (NCCL < 2.28 has no revoke: an abort frees it).
    if (p.freed()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ncclCommShrink of ", p.Describe(), ": the parent was aborted (freed); NCCL >= 2.28 "
          "revokes instead (ncclCommRevoke) so that shrink can follow an abort"));
    }
    // A revoked parent is quiescent by now (the policy polled it): default shrink. A parent in
    // error (a peer died, not revoked): NCCL_SHRINK_ABORT stops its pending ops first.
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(p.comm(), &state);
    const int flags = state == ncclSuccess ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT;
    RETURN_IF_ERROR(Issued(NcclStatus(ncclCommShrink(p.comm(), ex.data(), static_cast<int>(ex.size()),
                                                     &c, &cfg, flags),
                                      "ncclCommShrink", p.comm())));
    return Ready(c, p.device(), o, before, "ncclCommShrink");
#endif
  }

  absl::Status GroupCollective(const std::vector<Communicator*>& comms,
                               const std::vector<OpDesc>& ops) override {
    RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart"));
    absl::Status st;
    for (size_t i = 0; st.ok() && i < comms.size(); ++i) st = Issued(comms[i]->Collective(ops[i]));
    // In progress: the policy polls every communicator before EndOp.
    absl::Status end = NcclStatus(ncclGroupEnd(), "ncclGroupEnd");
    return st.ok() ? end : st;
  }

 private:
  // Waits for a split/shrink child, then wraps it with its rank and size.
  absl::StatusOr<std::unique_ptr<Communicator>> Ready(ncclComm_t c, int device,
                                                      const CommInitOptions& o, size_t before,
                                                      const char* what) {
    if (absl::Status s = WaitReady(c, o.timeout, absl::StrCat(what, "(", o.tag, ")")); !s.ok()) {
      ncclCommAbort(c);  // the new handle only
      return s;
    }
    int r = 0, n = 0;
    ncclCommUserRank(c, &r);
    ncclCommCount(c, &n);
    auto out = Wrap(c, device, r, n, o.tag, before);
    RETURN_IF_ERROR(static_cast<NcclCommunicator&>(*out).Setup());
    return out;
  }

  std::unique_ptr<Communicator> Wrap(ncclComm_t c, int device, int rank, int size,
                                     const std::string& tag, size_t free_before) {
    const size_t after = FreeBytes(device);
    return std::make_unique<NcclCommunicator>(c, device, rank, size, tag,
                                              free_before > after ? free_before - after : 0);
  }
};

absl::StatusOr<std::shared_ptr<CommDriver>> MakeDriver(const std::string& device) {
  RETURN_IF_ERROR(nccl_internal::CheckCudaDevice(device).status());
  return std::shared_ptr<CommDriver>(new NcclDriver());
}

const bool registered = [] {
  RegisterNcclDriverFactory(&MakeDriver);
  return true;
}();

}  // namespace
}  // namespace ember::comm
