// The UCX implementation of onesided::Agent (agent.h states the contract).
#include "runtime/onesided/agent.h"

#include <pthread.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"
#include "runtime/base/status_macros.h"
#include "runtime/flight/recorder.h"
#include "runtime/onesided/am_transfer.h"
#include "runtime/onesided/cuda_ipc.h"
#include "runtime/onesided/cuda_transfer.h"
#include "runtime/onesided/descriptor.h"
#include "runtime/onesided/parallel_copy.h"
#include "runtime/onesided/ucx_connection.h"

namespace ember::onesided {
namespace {

using internal::ConnectionImpl;
using internal::FromUcs;
using internal::PeerFailure;
using internal::Remote;
using internal::WorkerProgressor;

constexpr unsigned kNotifyAmId = 17;

class AgentImpl;

using internal::LocalRegion;

// user_data of one UCX request: keeps the transfer's state (and a notify's message) alive.
struct Part {
  std::shared_ptr<internal::WorkState> state;
  AgentImpl* agent = nullptr;
  ConnectionImpl* conn = nullptr;
  std::string header, message;  // Notify only: sender name and the message
};

class AgentImpl : public Agent {
 public:
  explicit AgentImpl(const AgentOptions& o) : opt_(o) {
    if (opt_.name.empty()) opt_.name = absl::StrCat("rank", opt_.rank);
  }
  ~AgentImpl() override;
  absl::Status Init();

  const std::string& name() const override { return opt_.name; }
  absl::StatusOr<Registration> RegisterMemory(void* ptr, uint64_t bytes, MemoryKind kind) override;
  absl::StatusOr<Registration> AllocateMemory(uint64_t bytes) override;
  absl::Status Deregister(uint64_t id) override;
  uint64_t refused_puts() const override { return am_server_.refused_puts(); }
  uint64_t refused_gets() const override { return am_server_.refused_gets(); }
  uint64_t peak_get_reply_bytes() const override { return am_server_.peak_reply_bytes(); }
  void HoldGetRepliesForTest(bool hold) override { am_server_.HoldReplies(hold); }
  size_t WaitingGetsForTest() const override { return am_server_.waiting_gets(); }
  absl::StatusOr<Connection*> Connect(absl::string_view peer) override;
  Work Put(Connection* c, const std::vector<LocalDesc>& l, const std::vector<RemoteDesc>& r,
           const TransferOptions& o) override {
    return Transfer(true, c, l, r, o);
  }
  Work Get(Connection* c, const std::vector<LocalDesc>& l, const std::vector<RemoteDesc>& r,
           const TransferOptions& o) override {
    return Transfer(false, c, l, r, o);
  }
  Work Notify(Connection* conn, absl::string_view message) override;
  absl::StatusOr<Notification> WaitNotification(absl::Duration timeout, WaitStyle style) override;

  // Request completion (progress thread).
  static void OnSend(void* request, ucs_status_t st, void* user_data);
  static ucs_status_t OnNotify(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t st) {
    static_cast<ConnectionImpl*>(arg)->Fail(st);
  }

 private:
  // Packs the descriptor of a mapped region and records it (takes over `memh`); a GPU region
  // carries its CUDA IPC export (`cuda_key`) where a host region has its UCX key.
  absl::StatusOr<Registration> Publish(void* ptr, uint64_t bytes, ucp_mem_h memh,
                                       MemoryKind kind = MemoryKind::kHost, std::string cuda_key = "");
  Work Transfer(bool put, Connection* c, const std::vector<LocalDesc>& local,
                const std::vector<RemoteDesc>& remote, const TransferOptions& options);
  struct Op { void* local; ucp_mem_h memh; uint64_t remote; ucp_rkey_h rkey; uint64_t len; char* mapped;
              uint64_t token; };  // token: the remote region's (active-message puts)
  // The CUDA IPC path of Transfer: cudaMemcpyAsync on options.cuda_stream (cuda_ipc.h).
  Work CudaTransfer(bool put, ConnectionImpl* conn, const std::vector<Op>& ops,
                    std::vector<std::shared_ptr<cuda_ipc::Mapping>> mappings, uint64_t total,
                    size_t regions, const TransferOptions& options);
  // The state of a Work of `parts` completions, with its flight-recorder entry (`fr_op`).
  std::shared_ptr<internal::WorkState> NewState(const char* what, const char* fr_op, ConnectionImpl* conn,
                                                uint64_t bytes, int regions, const char* direction,
                                                int parts, bool progress = true);
  // Accounts for the request just posted for `part` (put, get, flush or message): ends the part if
  // it completed at once, else Wake()s the progress thread (`wake`; Transfer wakes it once instead).
  void Finish(Part* part, ucs_status_ptr_t req, const internal::WorkState& state, bool wake = true);
  void SendNotify(Part* part);
  uint64_t Record(const char* op, ConnectionImpl* conn, uint64_t bytes, absl::string_view tag);
  // Requests were left in flight: wakes the progress thread from the worker's event fd. A parked
  // one (a waiter was active within kWaiterGrace, ucx_connection.h) drives them when its grace
  // ends, or at once with `kick`: the caller usually waits next and drives them itself.
  void Wake(bool kick = false) {
    if (efd_ >= 0) ucp_worker_signal(worker_);
    if (kick && progressor_ != nullptr) progressor_->Kick();
  }

  AgentOptions opt_;
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  int fr_group_ = -1;
  std::shared_ptr<WorkerProgressor> progressor_;
  std::thread progress_;
  std::atomic<bool> stop_{false};
  std::atomic<int> in_flight_{0};
  internal::PendingGets pending_gets_{&in_flight_};  // this agent's gets over active messages
  internal::AmServer am_server_{&opt_.name, &mu_, &regions_, &in_flight_,
                                opt_.max_get_reply_bytes_in_flight, opt_.max_queued_gets};  // peers' (am_transfer.h)
  std::atomic<uint64_t> remote_handles_{0};
  std::atomic<int64_t> note_count_{0};  // notes_.size(), readable without mu_
  bool tcp_segments_set_ = false;          // Init gave UCX kTcpSegmentBytes segments
  internal::ParallelCopier copier_;

  mutable absl::Mutex mu_;
  uint64_t next_reg_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, LocalRegion> regions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> connects_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<ConnectionImpl>> conns_ ABSL_GUARDED_BY(mu_);
  std::deque<Notification> notes_ ABSL_GUARDED_BY(mu_);
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;  // connections failed so far
};

absl::Status AgentImpl::Init() {
  if (opt_.store == nullptr) return absl::InvalidArgumentError("AgentOptions.store is null");
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return FromUcs(st, "reading the UCX configuration (check UCX_* variables)");
  const std::string net_devices = internal::ResolveNetDevices(opt_.net_devices);
  tcp_segments_set_ = internal::ApplyUcxDefaults(config, net_devices);
  if (!net_devices.empty()) {
    spdlog::debug("onesided {}: UCX network devices: {} (AgentOptions::net_devices '{}')", opt_.name,
                  net_devices, opt_.net_devices);
  }
  ucp_params_t p = {};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = 0;
  st = ucp_init(&p, config, &ctx_);
  ucp_config_release(config);
  if (st != UCS_OK) return FromUcs(st, "ucp_init (UCX_TLS may name no usable transport)");
  ucp_worker_params_t wp = {};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;
  st = ucp_worker_create(ctx_, &wp, &worker_);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create");
  if (ucp_worker_get_efd(worker_, &efd_) != UCS_OK) efd_ = -1;  // then poll by sleeping
  ucp_am_handler_param_t ap = {};
  ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  struct Handler { unsigned id; ucp_am_recv_callback_t cb; void* arg; };
  for (const Handler& h : {Handler{kNotifyAmId, &AgentImpl::OnNotify, this},
                           {internal::kPutAmId, &internal::AmServer::OnPut, &am_server_},
                           {internal::kGetRequestAmId, &internal::AmServer::OnGetRequest, &am_server_},
                           {internal::kGetReplyAmId, &internal::PendingGets::OnReply, &pending_gets_}}) {
    const unsigned id = h.id;
    ap.id = h.id;
    ap.cb = h.cb;
    ap.arg = h.arg;
    st = ucp_worker_set_am_recv_handler(worker_, &ap);
    if (st != UCS_OK) return FromUcs(st, absl::StrCat("registering the handler of active message ", id));
  }
  if (opt_.recorder != nullptr) {
    fr_group_ = opt_.recorder->RegisterGroup(
        {.name = absl::StrCat("onesided:", opt_.name), .rank = 0, .size = 1,
         .global_rank = opt_.rank, .backend = "ucx"});
  }
  progressor_ = std::make_shared<WorkerProgressor>(worker_);
  progress_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "onesided-prog");  // for top -H and perf
    internal::RunProgressLoop(worker_, efd_, *progressor_, stop_, in_flight_);
  });
  return absl::OkStatus();
}

AgentImpl::~AgentImpl() {
  if (progress_.joinable()) {
    stop_.store(true, std::memory_order_release);
    Wake(/*kick=*/true);
    progress_.join();
  }
  std::deque<std::unique_ptr<ConnectionImpl>> conns;
  std::map<uint64_t, LocalRegion> regions;
  {
    absl::MutexLock l(&mu_);
    conns.swap(conns_);
    regions.swap(regions_);
  }
  am_server_.DropQueues();  // before the endpoints their replies go to
  internal::CloseEndpoints(worker_, conns);
  pending_gets_.FailAll(nullptr, absl::CancelledError("the agent was destroyed"));
  for (auto& [id, reg] : regions)
    if (reg.memh != nullptr) ucp_mem_unmap(ctx_, reg.memh);
  if (progressor_ != nullptr) progressor_->Clear();  // waiters stop driving the worker
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (ctx_ != nullptr) ucp_cleanup(ctx_);
}

absl::StatusOr<Registration> AgentImpl::RegisterMemory(void* ptr, uint64_t bytes, MemoryKind kind) {
  if (ptr == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat("RegisterMemory: null pointer for ", bytes, " bytes"));
  }
  if (kind == MemoryKind::kCuda) {
    ASSIGN_OR_RETURN(std::string key, internal::ExportCudaRegion(ptr, bytes));
    return Publish(ptr, bytes, nullptr, kind, std::move(key));
  }
  ucp_mem_h memh = nullptr;
  if (bytes > 0) {
    ucp_mem_map_params_t mp = {};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = ptr;
    mp.length = bytes;
    ucs_status_t st = ucp_mem_map(ctx_, &mp, &memh);
    if (st != UCS_OK) {
      return FromUcs(st, absl::StrCat("registering ", bytes, " bytes at ",
                                      absl::Hex(reinterpret_cast<uintptr_t>(ptr))));
    }
  }
  return Publish(ptr, bytes, memh);
}

absl::StatusOr<Registration> AgentImpl::Publish(void* ptr, uint64_t bytes, ucp_mem_h memh,
                                                MemoryKind kind, std::string cuda_key) {
  RegionDescriptor d{opt_.name, reinterpret_cast<uint64_t>(ptr), bytes, std::move(cuda_key)};
  absl::StatusOr<uint64_t> token = NewRegionToken();
  if (!token.ok() && memh != nullptr) ucp_mem_unmap(ctx_, memh);
  RETURN_IF_ERROR(token.status());
  d.token = *token;
  if (memh != nullptr) {
    void* rkey = nullptr;
    size_t rkey_size = 0;
    ucs_status_t st = ucp_rkey_pack(ctx_, memh, &rkey, &rkey_size);
    if (st != UCS_OK) {
      ucp_mem_unmap(ctx_, memh);
      return FromUcs(st, "packing the remote key");
    }
    d.rkey.assign(static_cast<const char*>(rkey), rkey_size);
    ucp_rkey_buffer_release(rkey);
  }
  Registration out{0, ptr, bytes, kind, PackDescriptor(d)};
  absl::MutexLock l(&mu_);
  out.id = ++next_reg_;
  regions_[out.id] = LocalRegion{ptr, bytes, memh, kind, d.token};
  return out;
}

absl::StatusOr<Registration> AgentImpl::AllocateMemory(uint64_t bytes) {
  if (bytes == 0) return RegisterMemory(nullptr, 0, MemoryKind::kHost);
  void* address = nullptr;
  ASSIGN_OR_RETURN(ucp_mem_h memh, internal::AllocateUcxMemory(ctx_, bytes, &address));
  return Publish(address, bytes, memh);
}

absl::Status AgentImpl::Deregister(uint64_t id) {
  LocalRegion reg;
  {
    absl::MutexLock l(&mu_);
    auto it = regions_.find(id);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("Deregister: region ", id, " is not registered"));
    }
    reg = it->second;
    regions_.erase(it);
  }
  if (reg.memh != nullptr) {
    ucs_status_t st = ucp_mem_unmap(ctx_, reg.memh);
    if (st != UCS_OK) return FromUcs(st, absl::StrCat("deregistering region ", id));
  }
  return absl::OkStatus();
}

absl::StatusOr<Connection*> AgentImpl::Connect(absl::string_view peer) {
  if (peer == opt_.name) return absl::InvalidArgumentError(absl::StrCat("Connect: '", peer, "' is this agent"));
  int n;
  {
    absl::MutexLock l(&mu_);
    n = ++connects_[std::string(peer)];
  }
  ASSIGN_OR_RETURN(internal::PeerAddress theirs,
                   internal::ExchangeAddresses(*opt_.store, worker_, opt_.key_prefix, opt_.name,
                                               opt_.rank, peer, n, opt_.connect_timeout));
  const int peer_rank = theirs.rank;
  const std::string& addr = theirs.address;
  auto conn = std::make_unique<ConnectionImpl>(std::string(peer), peer_rank);
  conn->handle_counter = &remote_handles_;
  conn->in_flight = &in_flight_;
  conn->wake = [this] { Wake(); };
  conn->on_failure = [this, raw = conn.get()] {
    {
      absl::MutexLock l(&mu_);
      ++failures_;
    }
    pending_gets_.FailAll(raw, raw->health());  // no reply will come
  };
  RETURN_IF_ERROR(conn->Open(worker_, addr, opt_.detect_peer_failure, &AgentImpl::OnEpError));
  if (opt_.put_over_am && tcp_segments_set_ && !internal::EndpointHasRmaLane(conn->ep)) {
    conn->am_chunk = kAmPutChunkBytes;
  }
  Wake();
  absl::MutexLock l(&mu_);
  conns_.push_back(std::move(conn));
  return conns_.back().get();
}

uint64_t AgentImpl::Record(const char* op, ConnectionImpl* conn, uint64_t bytes, absl::string_view tag) {
  if (opt_.recorder == nullptr) return 0;
  return opt_.recorder->Record({.group_id = fr_group_, .p2p_seq = static_cast<int64_t>(conn->NextSeq()),
                                .op = op, .in_numel = static_cast<int64_t>(bytes),
                                .in_dtype = "uint8", .peer = conn->peer_rank(), .tag = tag});
}

void AgentImpl::Finish(Part* part, ucs_status_ptr_t req, const internal::WorkState& state, bool wake) {
  if (UCS_PTR_IS_PTR(req)) {
    if (wake) Wake();
    return;  // the callback ends the part
  }
  ucs_status_t st = UCS_PTR_STATUS(req);
  in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  part->state->PartDone(st == UCS_OK ? absl::OkStatus() : FromUcs(st, state.what()));
  delete part;
}

void AgentImpl::OnSend(void* request, ucs_status_t st, void* user_data) {
  auto* part = static_cast<Part*>(user_data);
  part->agent->in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  if (st != UCS_OK && PeerFailure(st)) part->conn->Fail(st);
  part->state->PartDone(st == UCS_OK ? absl::OkStatus() : FromUcs(st, part->state->what()));
  delete part;
  ucp_request_free(request);
}

Work AgentImpl::Transfer(bool put, Connection* c, const std::vector<LocalDesc>& local,
                         const std::vector<RemoteDesc>& remote, const TransferOptions& options) {
  const char* verb = put ? "Put" : "Get";
  auto* conn = static_cast<ConnectionImpl*>(c);
  if (conn == nullptr) return Work::Finished(absl::InvalidArgumentError(absl::StrCat(verb, ": null connection")));
  if (local.size() != remote.size()) {
    return Work::Finished(absl::InvalidArgumentError(absl::StrCat(
        verb, ": ", local.size(), " local descriptors but ", remote.size(), " remote ones")));
  }
  std::vector<Op> ops;
  std::vector<std::shared_ptr<cuda_ipc::Mapping>> mappings;  // kept open until the copies end
  int cuda_remotes = 0, cuda_locals = 0;
  uint64_t total = 0;
  for (size_t i = 0; i < local.size(); ++i) {
    const LocalDesc& l = local[i];
    const RemoteDesc& r = remote[i];
    if (l.length != r.length) {
      return Work::Finished(absl::InvalidArgumentError(absl::StrCat(
          verb, ": descriptor ", i, " has local length ", l.length, " but remote length ", r.length)));
    }
    LocalRegion reg;
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = regions_.find(l.registration);
      if (it == regions_.end()) {
        return Work::Finished(absl::FailedPreconditionError(absl::StrCat(
            verb, ": descriptor ", i, " names local region ", l.registration,
            ", which is not registered (deregistered, or never registered by this agent)")));
      }
      reg = it->second;
    }
    if (!InBounds(l.offset, l.length, reg.bytes)) {
      return Work::Finished(absl::InvalidArgumentError(absl::StrCat(
          verb, ": descriptor ", i, " reads/writes [", l.offset, ", +", l.length, ") outside local region ",
          l.registration, " of ", reg.bytes, " bytes")));
    }
    auto rem = conn->Lookup(r.region);
    if (!rem.ok()) return Work::Finished(rem.status());
    if (!InBounds(r.offset, r.length, rem->length)) {
      return Work::Finished(absl::InvalidArgumentError(absl::StrCat(
          verb, ": descriptor ", i, " accesses [", r.offset, ", +", r.length, ") outside ",
          conn->peer(), "'s region of ", rem->length, " bytes")));
    }
    total += l.length;
    if (rem->cuda != nullptr) {
      ++cuda_remotes;
      mappings.push_back(rem->cuda);
    }
    if (reg.kind == MemoryKind::kCuda) ++cuda_locals;
    if (l.length == 0) continue;
    ops.push_back({static_cast<char*>(reg.base) + l.offset, reg.memh, rem->base + r.offset, rem->rkey,
                   l.length, rem->mapped == nullptr ? nullptr : rem->mapped + r.offset, rem->token});
  }
  if (absl::Status h = conn->health(); !h.ok()) return Work::Finished(h);
  if (cuda_remotes > 0 || cuda_locals > 0) {
    absl::Status ok = internal::CheckCudaList(verb, cuda_remotes, cuda_locals, local.size());
    if (!ok.ok()) return Work::Finished(ok);
    return CudaTransfer(put, conn, ops, std::move(mappings), total, local.size(), options);
  }
  // Mapped peer memory, large: the caller and a helper thread copy (parallel_copy.h) instead of
  // UCX on one core. Below the threshold UCX's own copy (no thread hand-off) is as fast.
  if (opt_.parallel_copy_min_bytes > 0 && total >= opt_.parallel_copy_min_bytes &&
      std::all_of(ops.begin(), ops.end(), [](const Op& op) { return op.mapped != nullptr; })) {
    auto state = NewState(put ? "put" : "get", put ? "onesided_put" : "onesided_get", conn, total,
                          static_cast<int>(local.size()), put ? "to" : "from", 1);
    std::vector<internal::ParallelCopier::Segment> segments;
    for (const Op& op : ops) {
      segments.push_back(put ? internal::ParallelCopier::Segment{op.mapped, op.local, op.len}
                             : internal::ParallelCopier::Segment{op.local, op.mapped, op.len});
    }
    copier_.Copy(segments);  // complete here, so a later Notify needs no flush for it
    state->PartDone(absl::OkStatus());
    return Work(state);
  }
  // Over an endpoint without an RMA lane a put is the agent's own messages of up to 1 MiB each:
  // UCX sends them from the caller's buffer (its emulated put first copies each segment into a
  // send buffer) and the target's agent writes them (AmServer). A get is one request per element,
  // answered by the target's agent (am_transfer.h): UCX's emulated get and put carry no key.
  const bool am = conn->am_chunk > 0;
  int parts = 0;
  for (const Op& op : ops) parts += am && put ? internal::AmPutChunks(op.len) : 1;
  auto state = NewState(put ? "put" : "get", put ? "onesided_put" : "onesided_get", conn, total,
                        static_cast<int>(local.size()), put ? "to" : "from", parts + 1);
  if (put && !ops.empty()) conn->unflushed_puts.fetch_add(parts, std::memory_order_acq_rel);
  // The poster stands the progress thread aside while it posts, as a spinning waiter does: over
  // shared memory (and CMA) a put or get is a copy done inside ucp_*_nbx under the worker's lock,
  // and a progress thread spinning on that lock meanwhile took a second core from the copy (27%
  // of all samples of a 16 MiB get loop on 2 cores). It is woken if a request is left in flight.
  progressor_->EnterSpin();
  for (const Op& op : ops) {
    if (am && put) {
      internal::PostAmPut(conn, state, static_cast<const char*>(op.local), op.memh, op.token, op.remote, op.len,
                          &in_flight_);
      continue;
    }
    if (am) {
      pending_gets_.Post(conn, state, static_cast<char*>(op.local), op.token, op.remote, op.len);
      continue;
    }
    auto* part = new Part{state, this, conn};
    ucp_request_param_t rp = {};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
    rp.cb.send = &AgentImpl::OnSend;
    rp.user_data = part;
    rp.memh = op.memh;
    in_flight_.fetch_add(1, std::memory_order_acq_rel);
    ucs_status_ptr_t req = put ? ucp_put_nbx(conn->ep, op.local, op.len, op.remote, op.rkey, &rp)
                               : ucp_get_nbx(conn->ep, op.local, op.len, op.remote, op.rkey, &rp);
    Finish(part, req, *state, /*wake=*/false);
  }
  // Not kicked (Wake): a progress thread sending beside the caller, who usually waits next and
  // drives the requests itself, only contended for the worker's lock (10% of the poster's samples
  // in a TCP put loop). A kBlock waiter kicks it.
  progressor_->LeaveSpin(/*wake=*/false);
  if (in_flight_.load(std::memory_order_acquire) > 0) Wake();
  state->PartDone(absl::OkStatus());  // everything is posted
  return Work(state);
}

std::shared_ptr<internal::WorkState> AgentImpl::NewState(const char* what, const char* fr_op,
                                                        ConnectionImpl* conn, uint64_t bytes, int regions,
                                                        const char* direction, int parts, bool progress) {
  auto state = std::make_shared<internal::WorkState>(
      internal::WorkState::Desc{what, bytes, regions, direction, conn->peer()}, parts,
      progress ? progressor_ : nullptr);
  if (opt_.recorder != nullptr) state->SetRecord(opt_.recorder, Record(fr_op, conn, bytes, state->what()));
  return state;
}

Work AgentImpl::CudaTransfer(bool put, ConnectionImpl* conn, const std::vector<Op>& ops,
                             std::vector<std::shared_ptr<cuda_ipc::Mapping>> mappings, uint64_t total,
                             size_t regions, const TransferOptions& options) {
  auto state = NewState(put ? "CUDA IPC put" : "CUDA IPC get", put ? "onesided_put" : "onesided_get", conn,
                        total, static_cast<int>(regions), put ? "to" : "from", 1, /*progress=*/false);
  std::vector<cuda_ipc::Copy> copies;
  for (const Op& op : ops) {
    void* remote = reinterpret_cast<void*>(op.remote);
    copies.push_back(put ? cuda_ipc::Copy{remote, op.local, op.len} : cuda_ipc::Copy{op.local, remote, op.len});
  }
  return internal::StartCudaCopies(std::move(state), copies, std::move(mappings), options.cuda_stream);
}

Work AgentImpl::Notify(Connection* c, absl::string_view message) {
  auto* conn = static_cast<ConnectionImpl*>(c);
  if (conn == nullptr) return Work::Finished(absl::InvalidArgumentError("Notify: null connection"));
  if (message.size() > kMaxNotificationBytes) {
    return Work::Finished(absl::InvalidArgumentError(absl::StrCat(
        "Notify: message of ", message.size(), " bytes is over the limit of ", kMaxNotificationBytes)));
  }
  if (absl::Status h = conn->health(); !h.ok()) return Work::Finished(h);
  // No put to flush, no earlier notification waiting for a flush and no flight record to keep:
  // sent from here if UCX can complete it at once (a short message), without the Work state and
  // request context below (their allocations were a third of a notify ping-pong's time beyond UCX's
  // own).
  if (opt_.recorder == nullptr && conn->unflushed_puts.load(std::memory_order_acquire) == 0 &&
      !conn->notifies_behind_flush()) {
    const ucs_status_t st = conn->SendNow(kNotifyAmId, opt_.name, message, *progressor_);
    if (st == UCS_OK) return Work::Finished(absl::OkStatus());
    if (st != UCS_ERR_NO_RESOURCE) {  // else it would have had to queue: the general path below
      if (PeerFailure(st)) conn->Fail(st);
      return Work::Finished(FromUcs(st, absl::StrCat("notification of ", message.size(), " bytes to ", conn->peer())));
    }
  }
  auto state = NewState("notification", "onesided_notify", conn, message.size(), -1, "to", 1);
  auto* part = new Part{state, this, conn, opt_.name, std::string(message)};
  if (conn->unflushed_puts.exchange(0, std::memory_order_acq_rel) == 0 && !conn->notifies_behind_flush()) {
    SendNotify(part);  // nothing to wait for
    return Work(state);
  }
  // After a flush of the endpoint: every put issued before is then complete at the peer, so the
  // message arrives after the data it announces (and after every notification before it).
  conn->SendAfterFlush([part](ucs_status_t st) {
    if (st == UCS_OK) {
      part->agent->SendNotify(part);
      return;
    }
    if (PeerFailure(st)) part->conn->Fail(st);
    part->state->PartDone(FromUcs(st, absl::StrCat(part->state->what(), " (flushing the puts before it)")));
    delete part;
  });
  return Work(state);
}

void AgentImpl::SendNotify(Part* part) {
  ucp_request_param_t rp = {};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  rp.cb.send = &AgentImpl::OnSend;
  rp.user_data = part;
  rp.flags = UCP_AM_SEND_FLAG_EAGER;  // small: the receiver gets the data in its handler
  // Held here: once the send is posted, the callback may free `part` on another thread.
  const std::shared_ptr<internal::WorkState> state = part->state;
  in_flight_.fetch_add(1, std::memory_order_acq_rel);
  ucs_status_ptr_t req = ucp_am_send_nbx(part->conn->ep, kNotifyAmId, part->header.data(),
                                         part->header.size(), part->message.data(),
                                         part->message.size(), &rp);
  Finish(part, req, *state);
}

ucs_status_t AgentImpl::OnNotify(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<AgentImpl*>(arg);
  Notification n;
  n.peer.assign(static_cast<const char*>(header), header_length);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    n.message = "<notification lost: sent by rendezvous, which this agent does not accept>";
  } else {
    n.message.assign(static_cast<const char*>(data), length);
  }
  absl::MutexLock l(&self->mu_);
  self->notes_.push_back(std::move(n));
  self->note_count_.fetch_add(1);
  return UCS_OK;
}

absl::StatusOr<Notification> AgentImpl::WaitNotification(absl::Duration timeout, WaitStyle style) {
  absl::Time start = absl::InfinitePast();  // read only when needed (work.h, SpinUntil)
  if (style == WaitStyle::kSpin) {
    internal::SpinUntil(progressor_.get(), [this] { return note_count_.load() > 0; }, timeout, &start);
  } else {
    progressor_->Kick();  // the progress thread receives for us: now, not after its grace
  }
  absl::MutexLock l(&mu_);
  if (notes_.empty()) {
    if (start == absl::InfinitePast()) start = absl::Now();
    const absl::Time deadline = start + timeout;
    const int64_t failures_before = failures_;
    auto any = [this, failures_before]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !notes_.empty() || failures_ > failures_before;
    };
    const bool woke =
        mu_.AwaitWithTimeout(absl::Condition(&any), std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (notes_.empty()) {
      std::string failed;
      for (const auto& c : conns_) {
        if (absl::Status h = c->health(); !h.ok()) absl::StrAppend(&failed, " ", h.message(), ";");
      }
      if (woke) {
        return absl::UnavailableError(absl::StrCat(
            opt_.name, ": a connection failed while waiting for a notification:", failed));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          opt_.name, ": no notification within ", absl::FormatDuration(timeout),
          failed.empty() ? "" : absl::StrCat("; failed connections:", failed)));
    }
  }
  Notification n = std::move(notes_.front());
  notes_.pop_front();
  note_count_.fetch_sub(1);
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(const AgentOptions& options) {
  auto agent = std::make_unique<AgentImpl>(options);
  RETURN_IF_ERROR(agent->Init());
  return std::unique_ptr<Agent>(std::move(agent));
}

}  // namespace ember::onesided
