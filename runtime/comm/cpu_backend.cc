// The "cpu" backend: bootstrap over the rendezvous, shm/TCP channels per peer, the progress loop,
// the collective algorithms and the asynchronous tagged p2p engine.
//
// Two families of collectives:
// - Direct (every peer on shared memory): each rank copies its input into a staging slot of its
//   own shm segment, and every rank reads its peers' slots in place; a rank reduces all N inputs
//   of its slice at once (16-bit floats in f32, one rounding). Large messages stream through the
//   slots chunk by chunk. See "Direct shared-memory collectives" below.
// - Channel (TCP, or mixed groups): byte streams over rings/sockets; ring for large messages,
//   recursive doubling, binomial tree and pairwise exchange for small ones.
#include <fcntl.h>
#include <immintrin.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <fstream>
#include <list>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/backend.h"
#include "runtime/comm/env_knobs.h"
#include "runtime/comm/shm_ring.h"
#include "runtime/comm/tcp.h"

namespace ember::comm {

const char* OpTypeName(OpType t) {
  switch (t) {
    case OpType::kAllReduce: return "all_reduce";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAllGather: return "all_gather";
    case OpType::kReduceScatter: return "reduce_scatter";
    case OpType::kAllToAll: return "all_to_all";
    case OpType::kBarrier: return "barrier";
    case OpType::kSend: return "send";
    case OpType::kRecv: return "recv";
    case OpType::kGroupCreate: return "group_create";
  }
  return "?";
}

namespace {

constexpr uint32_t kHelloMagic = 0x454d4231;   // "EMB1"
constexpr uint32_t kOpMagic = 0x454d4f50;      // "EMOP"
constexpr uint32_t kP2PMagic = 0x454d5032;     // "EMP2"
constexpr size_t kStepBytes = 64 << 10;        // work per channel per progress iteration
// TCP: one send()/recv() per step costs a syscall, so let each step move up to 1 MiB (the kernel
// takes what fits in the 4 MiB socket buffer); recv-reduce is bounded by the channel's stage.
constexpr size_t kTcpStepBytes = 1 << 20;
// A futex wait on the shm doorbell gives up after this long and re-checks abort / peer liveness
// (Abort and Shutdown ring the doorbell, so this is only the fallback for a peer that died).
constexpr long kShmWaitUs = 5000;
constexpr int kMinSpin = 8;

// Most idle rounds to spin (pause) before sleeping on the doorbell. Spinning only pays when every
// local rank has its own core: with more ranks than online CPUs, a spinning waiter steals the core
// of the peer it waits for, so it sleeps after a few rounds. EMBER_COMM_SHM_SPIN overrides.
int ShmSpinRounds(int local_ranks) {
  if (const char* e = getenv(kEnvShmSpin)) {
    int v;
    if (absl::SimpleAtoi(e, &v) && v >= 0) return v;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 && local_ranks <= cpus ? 2000 : kMinSpin;
}

// Adaptive spin budget, kept across waits by one thread: halves whenever a wait had to sleep (the
// peer was not running: other load on the cores) and grows when a spin succeeds; every 32nd wait
// probes with the full budget so it can recover once the host is quiet again.
struct SpinBudget {
  int max = kMinSpin;
  int cur = kMinSpin;
  uint32_t waits = 0;
};

// Sleep on a doorbell after the spin budget: arm (register as waiter), let the caller re-check
// everything once more, then FUTEX_WAIT. Call Idle() after a round without progress and Busy()
// after one with progress.
class ShmWaiter {
 public:
  ShmWaiter(Doorbell* bell, SpinBudget* budget) : bell_(bell), b_(budget) {}
  ~ShmWaiter() { Busy(); }
  void Busy() {
    if (armed_) {
      DisarmDoorbell(bell_);
      armed_ = false;
    }
    if (idle_ > 0) {
      if (slept_) {
        b_->cur = std::max(kMinSpin, b_->cur / 2);
      } else if (idle_ > kMinSpin) {
        b_->cur = std::min(b_->max, std::max(b_->cur, 2 * idle_));
      }
    }
    idle_ = 0;
    slept_ = false;
  }
  void Idle() {
    if (!armed_) {
      if (idle_ == 0) limit_ = (++b_->waits % 32 == 0) ? b_->max : b_->cur;
      if (!slept_ && ++idle_ <= limit_) {
        _mm_pause();
        return;
      }
      seen_ = ArmDoorbell(bell_);
      armed_ = true;
      return;  // the caller re-checks its conditions before we sleep
    }
    WaitDoorbell(bell_, seen_, kShmWaitUs);
    DisarmDoorbell(bell_);
    armed_ = false;
    slept_ = true;  // the next idle round arms again at once
  }

 private:
  Doorbell* bell_;
  SpinBudget* b_;
  int idle_ = 0;
  int limit_ = 0;
  bool armed_ = false;
  bool slept_ = false;
  uint32_t seen_ = 0;
};

// Sent before an op's data on every channel the op uses; the receiver checks it matches.
struct OpHeader {
  uint32_t magic = kOpMagic;
  uint8_t type = 0, dtype = 0, reduce = 0, pad = 0;
  int32_t root = 0;
  int32_t pad2 = 0;
  int64_t seq = 0;
  uint64_t count = 0;
};
static_assert(sizeof(OpHeader) == 32, "wire format");

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t kind = 0;  // 0 = collective channel, 1 = p2p channel
  int32_t rank = 0;
  uint32_t name_hash = 0;
};

// Direct shared-memory collectives: the control block at the start of every rank's segment extra
// area, followed by three staging slots. Peers read both; only the owner writes.
//
// `sync` counts the syncs a rank has entered; a sync waits until every peer's count reaches ours.
// The header slot of sync v (v % 2) holds the op header published before entering v; it is read
// between passing v and entering v + 1, and rewritten for v + 2 only after every peer entered v + 1.
// Staging slot v % 3 holds data published before entering v; readers finish with it before they
// enter v + 2, and its owner rewrites it (for v + 3) only after passing v + 2.
struct alignas(64) DirectSlot {
  OpHeader hdr;
};
struct DirectCtl {
  alignas(64) std::atomic<uint64_t> sync{0};
  DirectSlot slot[2];
};
constexpr size_t kDirectCtlBytes = (sizeof(DirectCtl) + 63) / 64 * 64;
constexpr int kDirectStages = 3;

// Bytes per staging slot: the chunk a large op streams per sync (512 KiB by default, at least
// small_bytes). EMBER_COMM_DIRECT_STAGE_BYTES overrides it (same value on every rank, else the
// segments do not match and the group falls back to TCP).
size_t DirectStageBytes(const BackendOptions& o) {
  size_t v = std::max<size_t>(o.small_bytes, 512 << 10);
  if (const char* e = getenv(kEnvDirectStageBytes)) {
    size_t x;
    if (absl::SimpleAtoi(e, &x) && x >= 4096) v = x;
  }
  return (std::min<size_t>(v, 64 << 20) + 63) / 64 * 64;
}

bool DirectAllowedByEnv() {
  const char* e = getenv(kEnvShmDirect);
  return !(e && std::string(e) == "0");
}

struct P2PHeader {
  uint32_t magic = kP2PMagic;
  int32_t tag = 0;
  uint64_t bytes = 0;
};

uint32_t Fnv1a(absl::string_view s) {
  uint32_t h = 2166136261u;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h;
}

std::string BootId() {
  if (const char* e = getenv(kEnvBootId)) return e;  // tests: pretend to be another host
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  return s.empty() ? "unknown" : s;
}

std::string DescribeHeader(const OpHeader& h) {
  return absl::StrCat(OpTypeName(static_cast<OpType>(h.type)), " seq ", h.seq, " count ", h.count,
                      " ", DataTypeName(static_cast<DataType>(h.dtype)),
                      h.type == static_cast<uint8_t>(OpType::kAllReduce) ||
                              h.type == static_cast<uint8_t>(OpType::kReduceScatter)
                          ? absl::StrCat(" ", ReduceOpName(static_cast<ReduceOp>(h.reduce)))
                          : "",
                      h.type == static_cast<uint8_t>(OpType::kBroadcast)
                          ? absl::StrCat(" root ", h.root)
                          : "");
}

// One pending byte transfer of the progress loop.
struct Xfer {
  enum Kind : uint8_t { kSend, kRecvCopy, kRecvReduce, kRecvHeader };
  Kind kind = kSend;
  int peer = -1;
  Channel* ch = nullptr;
  char* buf = nullptr;
  size_t n = 0;
  size_t done = 0;
  const size_t* limit = nullptr;  // kSend: send only bytes below *limit (streaming forward)
  DataType dtype = DataType::kU8;
  ReduceOp reduce = ReduceOp::kSum;
  size_t esize = 1;
  char carry[8] = {};
  size_t carry_n = 0;
  bool finished() const { return done >= n; }
  bool is_send() const { return kind == kSend; }
};

struct Peer {
  int coll_fd = -1, p2p_fd = -1;  // owned when the channel is shm (liveness only)
  bool shm = false;
  std::unique_ptr<Channel> coll, p2p;
};

class CpuBackend;

// The asynchronous p2p engine: one thread per group progresses sends, matches incoming messages
// to posted receives by (peer, tag) in order and buffers unexpected ones.
class P2PEngine {
 public:
  P2PEngine(CpuBackend* be, int size) : be_(be), in_(size), sendq_(size), posted_(size),
                                        unexpected_(size) {}
  void Start() { thread_ = std::thread([this] { Loop(); }); }
  void Stop() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    Wake();
    if (thread_.joinable()) thread_.join();
  }
  void Post(bool send, char* data, size_t bytes, int peer, int tag,
            std::function<void(absl::Status)> done);
  void FailAll(const absl::Status& s);
  // Rings the engine's own shm doorbell (new work, stop) in case the thread sleeps on it.
  void Wake();

 private:
  struct Op {
    char* buf;
    size_t bytes;
    int tag;
    size_t done = 0;
    bool hdr_sent = false;
    P2PHeader hdr;
    std::function<void(absl::Status)> cb;
  };
  struct Unexpected {
    int tag;
    std::vector<char> data;
    bool complete = false;  // still being received while false
  };
  struct Incoming {
    P2PHeader hdr;
    size_t hdr_got = 0;
    size_t remaining = 0;
    char* dst = nullptr;  // posted buffer, unexpected buffer or null (discard)
    std::shared_ptr<Op> op;
    bool active = false;  // reading a payload
    bool to_unexpected = false;
  };
  void Loop();
  bool ProgressLocked(std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyPendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CpuBackend* be_;
  std::thread thread_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  std::vector<Incoming> in_ ABSL_GUARDED_BY(mu_);
  std::vector<std::deque<std::shared_ptr<Op>>> sendq_ ABSL_GUARDED_BY(mu_);
  std::vector<std::list<std::shared_ptr<Op>>> posted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::list<Unexpected>> unexpected_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> dead_ = std::vector<bool>(in_.size(), false);  // engine thread only
};

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(BackendOptions o) : o_(std::move(o)), peers_(o_.size), p2p_(this, o_.size) {}
  ~CpuBackend() override {
    p2p_.Stop();
    for (Peer& p : peers_) {
      if (p.shm) {
        if (p.coll_fd >= 0) close(p.coll_fd);
        if (p.p2p_fd >= 0) close(p.p2p_fd);
      }
    }
  }

  absl::Status Connect() override;
  absl::Status Run(const OpDesc& op) override;
  void PostSend(const void* data, size_t bytes, int dst, int tag,
                std::function<void(absl::Status)> done) override {
    p2p_.Post(true, const_cast<char*>(static_cast<const char*>(data)), bytes, dst, tag,
              std::move(done));
  }
  void PostRecv(void* data, size_t bytes, int src, int tag,
                std::function<void(absl::Status)> done) override {
    p2p_.Post(false, static_cast<char*>(data), bytes, src, tag, std::move(done));
  }
  void Abort(const absl::Status& why) override {
    bool was = abort_.exchange(true);
    if (was) return;
    {
      absl::MutexLock l(&abort_mu_);
      abort_status_ = why;
    }
    for (Peer& p : peers_) {
      if (p.coll) p.coll->Shutdown();
      if (p.p2p) p.p2p->Shutdown();
      if (p.shm) {
        if (p.coll_fd >= 0) shutdown(p.coll_fd, SHUT_RDWR);
        if (p.p2p_fd >= 0) shutdown(p.p2p_fd, SHUT_RDWR);
      }
    }
    p2p_.FailAll(AbortStatus());
  }
  std::string Describe() const override {
    int shm = 0, tcp = 0;
    for (int i = 0; i < o_.size; ++i)
      if (i != o_.rank) (peers_[i].shm ? shm : tcp)++;
    return absl::StrCat("cpu: shm x", shm, ", tcp x", tcp, direct_ ? ", direct" : "");
  }

  bool aborted() const { return abort_.load(std::memory_order_relaxed); }
  absl::Status AbortStatus() {
    absl::MutexLock l(&abort_mu_);
    return abort_status_.ok() ? absl::AbortedError("group aborted") : abort_status_;
  }
  Peer& peer(int r) { return peers_[r]; }
  const BackendOptions& options() const { return o_; }
  // Waits without burning the core forever: spin, then yield, then poll/sleep. Used when TCP
  // channels are pending (alone or mixed with shm ones).
  static void Backoff(int idle, const std::vector<pollfd>& fds);
  // Own doorbell of a channel kind (0 collective, 1 p2p), or null without shm.
  Doorbell* bell(int kind) const { return my_seg_ ? my_seg_->doorbell(kind) : nullptr; }
  SpinBudget* p2p_spin() { return &p2p_spin_; }

 private:
  // The progress loop: runs until every transfer is done, one fails, or the group aborts.
  absl::Status Progress(Xfer* xs, int k);
  absl::Status StepXfer(Xfer& x, bool* progressed);
  // Adds the op header exchange with `peer` (send and/or receive) the first time the op uses it.
  void AddHeaders(std::vector<Xfer>* xs, int send_peer, int recv_peer);
  absl::Status CheckHeaders(const std::vector<Xfer>& xs);
  absl::Status CheckHeader(int peer, const OpHeader& theirs);

  // Direct shared-memory collectives (direct_ only).
  DirectCtl* ctl(int r) const {
    return reinterpret_cast<DirectCtl*>((r == o_.rank ? my_seg_ : peer_segs_[r])->extra());
  }
  // Rank r's staging slot for sync v.
  char* stage(int r, uint64_t v) const {
    return (r == o_.rank ? my_seg_ : peer_segs_[r])->extra() + kDirectCtlBytes +
           (v % kDirectStages) * DirectStageBytes(o_);
  }
  // Publishes hdr_, enters the next sync and waits until every peer entered it; then checks every
  // peer's header against ours. Returns the sync's number through *v (may be null).
  absl::Status DirectSync(uint64_t* v = nullptr);
  absl::Status DirectWait(uint64_t v);
  absl::Status DirectAllReduce(char* buf, size_t count);
  absl::Status DirectReduceScatter(const char* in, char* out, size_t count);
  // all_gather (root < 0) or broadcast from root: every rank's `in` (bytes) lands at
  // out + rank * bytes (all_gather) or at out on every rank (broadcast).
  absl::Status DirectGather(const char* in, char* out, size_t bytes, int root);
  absl::Status RunDirect(const OpDesc& op);

  // Algorithms. `buf` is bytes; counts are elements.
  absl::Status RingAllReduce(char* buf, size_t count);
  absl::Status RecursiveDoublingAllReduce(char* buf, size_t count);
  absl::Status Broadcast(char* buf, size_t count, int root);
  absl::Status AllGather(const char* in, char* out, size_t count);
  absl::Status RingReduceScatterInPlace(char* buf, size_t count, int owner_shift);
  absl::Status ReduceScatter(const char* in, char* out, size_t count);
  absl::Status AllToAll(const char* in, char* out, size_t count);
  absl::Status Exchange(int send_peer, const char* send, size_t send_bytes, int recv_peer,
                        char* recv, size_t recv_bytes, Xfer::Kind recv_kind,
                        const size_t* limit = nullptr);

  const BackendOptions o_;
  std::vector<Peer> peers_;
  std::unique_ptr<TcpListener> listener_;
  std::unique_ptr<ShmSegment> my_seg_;
  std::vector<std::unique_ptr<ShmSegment>> peer_segs_;
  SpinBudget coll_spin_, p2p_spin_;  // executor thread / p2p thread
  bool direct_ = false;              // constant after Connect
  uint64_t direct_sync_ = 0;         // syncs entered (executor thread only)
  std::atomic<bool> abort_{false};
  absl::Mutex abort_mu_;
  absl::Status abort_status_ ABSL_GUARDED_BY(abort_mu_);
  P2PEngine p2p_;

  // Per-op state of Run (executor thread only).
  OpHeader hdr_;
  std::vector<char> hdr_sent_, hdr_recvd_;
  std::vector<OpHeader> peer_hdrs_;
  std::vector<char> scratch_;
  size_t esize_ = 1;
  DataType dtype_ = DataType::kU8;
  ReduceOp reduce_ = ReduceOp::kSum;
};

// ---------------------------------------------------------------------------------------------
// Bootstrap

absl::Status CpuBackend::Connect() {
  const int rank = o_.rank, size = o_.size;
  if (size == 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(listener_, TcpListener::Listen(o_.host));
  std::string boot = BootId();
  std::string shm_name = "-";
  size_t ring = o_.shm_ring_bytes;
  if (o_.enable_shm) {
    std::random_device rd;
    shm_name = absl::StrCat("/ember-", getpid(), "-", absl::Hex(rd()), absl::Hex(rd()));
    auto seg = ShmSegment::Create(shm_name, 2 * size, ring,
                                  kDirectCtlBytes + kDirectStages * DirectStageBytes(o_));
    if (seg.ok()) {
      my_seg_ = std::move(*seg);
      new (my_seg_->extra()) DirectCtl();
    } else {
      shm_name = "-";  // fall back to TCP
    }
  }
  std::string me = absl::StrCat("v1 ", boot, " ", o_.host, " ", listener_->port(), " ", shm_name,
                                " ", getpid());
  RETURN_IF_ERROR(o_.rendezvous->Set(absl::StrCat(o_.key_prefix, "peer/", rank), me));
  struct Info {
    std::string boot, host, shm;
    int port = 0;
  };
  std::vector<Info> info(size);
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    absl::StatusOr<std::string> v =
        o_.rendezvous->Get(absl::StrCat(o_.key_prefix, "peer/", r), o_.bootstrap_timeout);
    if (!v.ok()) {
      return base::Annotate(v.status(), absl::StrCat("group '", o_.group_name, "' rank ", rank,
                                                     ": waiting for rank ", r, " to join"));
    }
    std::vector<std::string> f = absl::StrSplit(*v, ' ');
    if (f.size() < 6 || f[0] != "v1" || !absl::SimpleAtoi(f[3], &info[r].port))
      return absl::InvalidArgumentError(absl::StrCat("bad peer record for rank ", r, ": ", *v));
    info[r].boot = f[1];
    info[r].host = f[2];
    info[r].shm = f[4];
  }
  // Lower ranks dial higher ones (twice: collective and p2p channel); the backlog holds them.
  uint32_t name_hash = Fnv1a(o_.group_name);
  for (int r = rank + 1; r < size; ++r) {
    for (uint32_t kind = 0; kind < 2; ++kind) {
      ASSIGN_OR_RETURN(int fd, TcpConnect(info[r].host, info[r].port, o_.bootstrap_timeout));
      Hello h;
      h.kind = kind;
      h.rank = rank;
      h.name_hash = name_hash;
      RETURN_IF_ERROR(WriteFull(fd, &h, sizeof(h)));
      (kind == 0 ? peers_[r].coll_fd : peers_[r].p2p_fd) = fd;
    }
  }
  for (int i = 0; i < 2 * rank; ++i) {
    ASSIGN_OR_RETURN(int fd, listener_->Accept(o_.bootstrap_timeout));
    Hello h;
    absl::Status st = ReadFull(fd, &h, sizeof(h), o_.bootstrap_timeout);
    if (!st.ok() || h.magic != kHelloMagic || h.name_hash != name_hash || h.rank < 0 ||
        h.rank >= rank || h.kind > 1) {
      close(fd);
      --i;  // a stray connection; keep waiting for the real peers
      continue;
    }
    (h.kind == 0 ? peers_[h.rank].coll_fd : peers_[h.rank].p2p_fd) = fd;
  }
  // Shared memory where both sides offer it and share a boot id (same host, same kernel).
  peer_segs_.resize(size);
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (my_seg_ && info[r].shm != "-" && info[r].boot == boot) {
      auto seg = ShmSegment::Open(info[r].shm, 2 * size, ring,
                                  kDirectCtlBytes + kDirectStages * DirectStageBytes(o_));
      if (seg.ok()) {
        peer_segs_[r] = std::move(*seg);
        peers_[r].shm = true;
      }
    }
  }
  // Barrier over TCP (1 byte each way: "1" = I map your segment), then drop the shm names.
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    char c = peers_[r].shm ? '1' : '0';
    RETURN_IF_ERROR(WriteFull(peers_[r].coll_fd, &c, 1));
  }
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    char c = 0;
    RETURN_IF_ERROR(ReadFull(peers_[r].coll_fd, &c, 1, o_.bootstrap_timeout));
    bool both = peers_[r].shm && c == '1';
    if (!both) peers_[r].shm = false;
  }
  // Direct collectives need every peer on shm. A rank's view of that can differ from a peer's
  // (another pair may have fallen back to TCP), so all ranks exchange their verdict and use direct
  // collectives only if every rank can.
  bool can_direct = my_seg_ != nullptr && DirectAllowedByEnv();
  for (int r = 0; r < size; ++r)
    if (r != rank && !peers_[r].shm) can_direct = false;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    char c = can_direct ? '1' : '0';
    RETURN_IF_ERROR(WriteFull(peers_[r].coll_fd, &c, 1));
  }
  direct_ = can_direct;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    char c = 0;
    RETURN_IF_ERROR(ReadFull(peers_[r].coll_fd, &c, 1, o_.bootstrap_timeout));
    if (c != '1') direct_ = false;
  }
  if (my_seg_) my_seg_->Unlink();
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    Peer& p = peers_[r];
    if (p.shm) {
      for (int kind = 0; kind < 2; ++kind) {
        int out = rank * 2 + kind, in = r * 2 + kind;
        (kind == 0 ? p.coll : p.p2p) = MakeShmChannel(
            peer_segs_[r]->header(out), peer_segs_[r]->data(out), my_seg_->header(in),
            my_seg_->data(in), ring, p.coll_fd, peer_segs_[r]->doorbell(kind),
            my_seg_->doorbell(kind));
      }
    } else {
      TuneSocket(p.coll_fd);
      TuneSocket(p.p2p_fd);
      p.coll = MakeTcpChannel(p.coll_fd);
      p.p2p = MakeTcpChannel(p.p2p_fd);
    }
  }
  int local = 1;
  for (int r = 0; r < size; ++r)
    if (r != rank && peers_[r].shm) ++local;
  coll_spin_.max = coll_spin_.cur = p2p_spin_.max = p2p_spin_.cur = ShmSpinRounds(local);
  p2p_.Start();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Progress

void CpuBackend::Backoff(int idle, const std::vector<pollfd>& fds) {
  if (!fds.empty()) {
    // Each idle round re-tries send()/recv() (syscalls that return EAGAIN); on shared, oversubscribed
    // cores that spinning steals the peer's CPU, so go to poll() after a few rounds.
    if (idle < 16) {
      _mm_pause();
      return;
    }
    std::vector<pollfd> f = fds;
    poll(f.data(), f.size(), 5);
    return;
  }
  if (idle < 2000) {
    _mm_pause();
  } else if (idle < 2000 + 2000) {
    sched_yield();
  } else {
    timespec ts{0, std::min<long>(1000000, 20000L * (1 + (idle - 4000) / 100))};
    nanosleep(&ts, nullptr);
  }
}

absl::Status CpuBackend::StepXfer(Xfer& x, bool* progressed) {
  size_t want = std::min(x.n - x.done, x.ch->is_shm() ? kStepBytes : kTcpStepBytes);
  if (x.kind == Xfer::kSend) {
    if (x.limit) want = std::min(want, *x.limit > x.done ? *x.limit - x.done : 0);
    if (want == 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(size_t k, x.ch->TrySend(x.buf + x.done, want));
    x.done += k;
    *progressed |= k > 0;
    return absl::OkStatus();
  }
  if (x.kind == Xfer::kRecvCopy || x.kind == Xfer::kRecvHeader) {
    ASSIGN_OR_RETURN(size_t k, x.ch->TryRecv(x.buf + x.done, want));
    x.done += k;
    *progressed |= k > 0;
    return absl::OkStatus();
  }
  // kRecvReduce: reduce straight out of the channel (the shm ring) into the destination.
  if (x.carry_n == 0) {
    ASSIGN_OR_RETURN(ReadSpan s, x.ch->Peek(want));
    size_t whole = s.size / x.esize * x.esize;
    if (whole > 0) {
      Reduce(x.buf + x.done, s.data, whole / x.esize, x.dtype, x.reduce);
      x.ch->Consume(whole);
      x.done += whole;
      *progressed = true;
      return absl::OkStatus();
    }
    if (s.size == 0) return absl::OkStatus();
  }
  // An element split across the ring's wrap point (or a short TCP read): assemble it.
  ASSIGN_OR_RETURN(size_t k, x.ch->TryRecv(x.carry + x.carry_n, x.esize - x.carry_n));
  x.carry_n += k;
  *progressed |= k > 0;
  if (x.carry_n == x.esize) {
    Reduce(x.buf + x.done, x.carry, 1, x.dtype, x.reduce);
    x.done += x.esize;
    x.carry_n = 0;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Progress(Xfer* xs, int k) {
  int idle = 0;
  std::vector<pollfd> fds;
  ShmWaiter waiter(bell(0), &coll_spin_);
  while (true) {
    if (aborted()) return AbortStatus();
    bool progressed = false, all_done = true;
    bool any_shm = false;
    fds.clear();
    for (int i = 0; i < k; ++i) {
      Xfer& x = xs[i];
      if (x.finished()) continue;
      all_done = false;
      // Transfers on one channel direction run in list order.
      bool blocked = false;
      for (int j = 0; j < i; ++j) {
        if (!xs[j].finished() && xs[j].ch == x.ch && xs[j].is_send() == x.is_send()) {
          blocked = true;
          break;
        }
      }
      if (blocked) continue;
      absl::Status st = StepXfer(x, &progressed);
      if (!st.ok()) {
        if (aborted()) return AbortStatus();
        return base::Annotate(st, absl::StrCat("group '", o_.group_name, "' rank ", o_.rank,
                                               " <-> rank ", x.peer));
      }
      if (x.kind == Xfer::kRecvHeader && x.finished()) {
        RETURN_IF_ERROR(CheckHeaders(std::vector<Xfer>{x}));
      }
      if (!x.finished()) {
        if (x.ch->is_shm()) {
          any_shm = true;
        } else {
          fds.push_back({x.ch->fd(), static_cast<short>(x.is_send() ? POLLOUT : POLLIN), 0});
        }
      }
    }
    if (all_done) return absl::OkStatus();
    if (progressed) {
      idle = 0;
      waiter.Busy();
      continue;
    }
    if (any_shm && fds.empty()) {
      // Only shm transfers pending: every peer rings our doorbell when it moves a ring we wait on.
      waiter.Idle();
      continue;
    }
    waiter.Busy();
    ++idle;
    if (any_shm) fds.clear();
    Backoff(idle, fds);
  }
}

absl::Status CpuBackend::CheckHeaders(const std::vector<Xfer>& xs) {
  for (const Xfer& x : xs) {
    if (x.kind != Xfer::kRecvHeader) continue;
    OpHeader theirs;
    std::memcpy(&theirs, x.buf, sizeof(theirs));
    RETURN_IF_ERROR(CheckHeader(x.peer, theirs));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CheckHeader(int peer, const OpHeader& theirs) {
  if (theirs.magic != kOpMagic) {
    return absl::InternalError(absl::StrCat("group '", o_.group_name, "' rank ", o_.rank,
                                            ": stream from rank ", peer,
                                            " is out of sync (bad op header)"));
  }
  if (theirs.type != hdr_.type || theirs.dtype != hdr_.dtype || theirs.count != hdr_.count ||
      theirs.seq != hdr_.seq || theirs.reduce != hdr_.reduce || theirs.root != hdr_.root) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective mismatch in group '", o_.group_name, "': rank ", o_.rank, " called ",
        DescribeHeader(hdr_), " but rank ", peer, " called ", DescribeHeader(theirs)));
  }
  return absl::OkStatus();
}

void CpuBackend::AddHeaders(std::vector<Xfer>* xs, int send_peer, int recv_peer) {
  if (send_peer >= 0 && !hdr_sent_[send_peer]) {
    hdr_sent_[send_peer] = 1;
    Xfer x;
    x.kind = Xfer::kSend;
    x.peer = send_peer;
    x.ch = peers_[send_peer].coll.get();
    x.buf = reinterpret_cast<char*>(&hdr_);
    x.n = sizeof(hdr_);
    xs->push_back(x);
  }
  if (recv_peer >= 0 && !hdr_recvd_[recv_peer]) {
    hdr_recvd_[recv_peer] = 1;
    Xfer x;
    x.kind = Xfer::kRecvHeader;
    x.peer = recv_peer;
    x.ch = peers_[recv_peer].coll.get();
    x.buf = reinterpret_cast<char*>(&peer_hdrs_[recv_peer]);
    x.n = sizeof(OpHeader);
    xs->push_back(x);
  }
}

absl::Status CpuBackend::Exchange(int send_peer, const char* send, size_t send_bytes,
                                  int recv_peer, char* recv, size_t recv_bytes,
                                  Xfer::Kind recv_kind, const size_t* limit) {
  std::vector<Xfer> xs;
  xs.reserve(4);
  AddHeaders(&xs, send_peer, recv_peer);
  if (send_peer >= 0 && send_bytes > 0) {
    Xfer x;
    x.kind = Xfer::kSend;
    x.peer = send_peer;
    x.ch = peers_[send_peer].coll.get();
    x.buf = const_cast<char*>(send);
    x.n = send_bytes;
    x.limit = limit;
    xs.push_back(x);
  }
  size_t recv_index = xs.size();
  if (recv_peer >= 0 && recv_bytes > 0) {
    Xfer x;
    x.kind = recv_kind;
    x.peer = recv_peer;
    x.ch = peers_[recv_peer].coll.get();
    x.buf = recv;
    x.n = recv_bytes;
    x.dtype = dtype_;
    x.reduce = reduce_;
    x.esize = esize_;
    xs.push_back(x);
  }
  (void)recv_index;
  return Progress(xs.data(), static_cast<int>(xs.size()));
}

// ---------------------------------------------------------------------------------------------
// Algorithms

namespace {
inline size_t ChunkOff(size_t count, int n, int i) { return count * i / n; }
inline int Mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

absl::Status CpuBackend::Run(const OpDesc& op) {
  if (aborted()) return AbortStatus();
  const int n = o_.size, r = o_.rank;
  esize_ = DataTypeSize(op.dtype);
  dtype_ = op.dtype;
  reduce_ = op.reduce;
  hdr_ = OpHeader();
  hdr_.type = static_cast<uint8_t>(op.type);
  hdr_.dtype = static_cast<uint8_t>(op.dtype);
  hdr_.reduce = (op.type == OpType::kAllReduce || op.type == OpType::kReduceScatter)
                    ? static_cast<uint8_t>(op.reduce) : 0;
  hdr_.root = op.type == OpType::kBroadcast ? op.root : 0;
  hdr_.seq = op.seq;
  hdr_.count = op.count;
  hdr_sent_.assign(n, 0);
  hdr_recvd_.assign(n, 0);
  peer_hdrs_.resize(n);
  const size_t bytes = op.count * esize_;
  char* out = static_cast<char*>(op.out);
  const char* in = static_cast<const char*>(op.in);

  if (n == 1) {
    if (op.type == OpType::kAllGather || op.type == OpType::kReduceScatter ||
        op.type == OpType::kAllToAll) {
      if (bytes) std::memmove(out, in, bytes);
    }
    return absl::OkStatus();
  }
  if (direct_) return RunDirect(op);
  absl::Status st;
  switch (op.type) {
    case OpType::kAllReduce:
    case OpType::kBarrier:
    case OpType::kGroupCreate:
      if (op.type != OpType::kAllReduce) {
        // Barrier / group creation: a 1-byte max all-reduce carries the descriptor check.
        static thread_local uint8_t one;
        one = 1;
        dtype_ = DataType::kU8;
        esize_ = 1;
        reduce_ = ReduceOp::kMax;
        st = RecursiveDoublingAllReduce(reinterpret_cast<char*>(&one), 1);
        break;
      }
      if (bytes == 0) {
        st = Exchange(Mod(r + 1, n), nullptr, 0, Mod(r - 1, n), nullptr, 0, Xfer::kRecvCopy);
      } else if (bytes <= o_.small_bytes || op.count < static_cast<size_t>(n)) {
        st = RecursiveDoublingAllReduce(out, op.count);
      } else {
        st = RingAllReduce(out, op.count);
      }
      if (st.ok() && op.reduce == ReduceOp::kAvg && op.count) FinishAvg(out, op.count, op.dtype, n);
      break;
    case OpType::kBroadcast:
      st = Broadcast(out, op.count, op.root);
      break;
    case OpType::kAllGather:
      st = AllGather(in, out, op.count);
      break;
    case OpType::kReduceScatter:
      st = ReduceScatter(in, out, op.count);
      if (st.ok() && op.reduce == ReduceOp::kAvg && op.count) FinishAvg(out, op.count, op.dtype, n);
      break;
    case OpType::kAllToAll:
      st = AllToAll(in, out, op.count);
      break;
    default:
      st = absl::InvalidArgumentError("not a collective");
  }
  return st;
}

absl::Status CpuBackend::RingAllReduce(char* buf, size_t count) {
  RETURN_IF_ERROR(RingReduceScatterInPlace(buf, count, 1));
  // Rank r now owns chunk r+1; circulate the reduced chunks.
  const int n = o_.size, r = o_.rank, next = Mod(r + 1, n), prev = Mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    int sc = Mod(r + 1 - s, n), rc = Mod(r - s, n);
    size_t so = ChunkOff(count, n, sc), ro = ChunkOff(count, n, rc);
    RETURN_IF_ERROR(Exchange(next, buf + so * esize_, (ChunkOff(count, n, sc + 1) - so) * esize_,
                             prev, buf + ro * esize_, (ChunkOff(count, n, rc + 1) - ro) * esize_,
                             Xfer::kRecvCopy));
  }
  return absl::OkStatus();
}

// After it, rank r holds the full reduction of chunk (r + owner_shift) mod n in place.
absl::Status CpuBackend::RingReduceScatterInPlace(char* buf, size_t count, int owner_shift) {
  const int n = o_.size, r = o_.rank, next = Mod(r + 1, n), prev = Mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    int sc = Mod(r - s + owner_shift - 1, n), rc = Mod(r - s + owner_shift - 2, n);
    size_t so = ChunkOff(count, n, sc), ro = ChunkOff(count, n, rc);
    RETURN_IF_ERROR(Exchange(next, buf + so * esize_, (ChunkOff(count, n, sc + 1) - so) * esize_,
                             prev, buf + ro * esize_, (ChunkOff(count, n, rc + 1) - ro) * esize_,
                             Xfer::kRecvReduce));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::RecursiveDoublingAllReduce(char* buf, size_t count) {
  const int n = o_.size, r = o_.rank;
  const size_t bytes = count * esize_;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  int vr;  // rank among the power-of-two participants, -1 if folded out
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      RETURN_IF_ERROR(Exchange(r + 1, buf, bytes, -1, nullptr, 0, Xfer::kRecvCopy));
      vr = -1;
    } else {
      RETURN_IF_ERROR(Exchange(-1, nullptr, 0, r - 1, buf, bytes, Xfer::kRecvReduce));
      vr = r / 2;
    }
  } else {
    vr = r - rem;
  }
  if (vr >= 0) {
    for (int mask = 1; mask < p; mask <<= 1) {
      int pv = vr ^ mask;
      int partner = pv < rem ? pv * 2 + 1 : pv + rem;
      // Exchange whole buffers: receive into scratch, then combine (partner reads `buf` while we
      // read theirs, so reducing in place while sending would race with our own send).
      RETURN_IF_ERROR(Exchange(partner, buf, bytes, partner, scratch_.data(), bytes,
                               Xfer::kRecvCopy));
      Reduce(buf, scratch_.data(), count, dtype_, reduce_);
    }
  }
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      RETURN_IF_ERROR(Exchange(-1, nullptr, 0, r + 1, buf, bytes, Xfer::kRecvCopy));
    } else {
      RETURN_IF_ERROR(Exchange(r - 1, buf, bytes, -1, nullptr, 0, Xfer::kRecvCopy));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Broadcast(char* buf, size_t count, int root) {
  const int n = o_.size, r = o_.rank;
  const size_t bytes = count * esize_;
  const int vr = Mod(r - root, n);
  if (bytes <= o_.small_bytes) {
    // Binomial tree.
    int mask = 1;
    while (mask < n) {
      if (vr & mask) {
        RETURN_IF_ERROR(Exchange(-1, nullptr, 0, Mod(vr - mask + root, n), buf, bytes,
                                 Xfer::kRecvCopy));
        break;
      }
      mask <<= 1;
    }
    mask >>= 1;
    while (mask > 0) {
      if (vr + mask < n)
        RETURN_IF_ERROR(Exchange(Mod(vr + mask + root, n), buf, bytes, -1, nullptr, 0,
                                 Xfer::kRecvCopy));
      mask >>= 1;
    }
    return absl::OkStatus();
  }
  // Pipelined chain root -> root+1 -> ...: forward bytes as soon as they arrive.
  int prev = vr == 0 ? -1 : Mod(r - 1, n);
  int next = vr == n - 1 ? -1 : Mod(r + 1, n);
  std::vector<Xfer> xs;
  AddHeaders(&xs, next, prev);
  size_t recv_i = xs.size();
  if (prev >= 0) {
    Xfer x;
    x.kind = Xfer::kRecvCopy;
    x.peer = prev;
    x.ch = peers_[prev].coll.get();
    x.buf = buf;
    x.n = bytes;
    xs.push_back(x);
  }
  if (next >= 0) {
    Xfer x;
    x.kind = Xfer::kSend;
    x.peer = next;
    x.ch = peers_[next].coll.get();
    x.buf = buf;
    x.n = bytes;
    xs.push_back(x);
  }
  if (prev >= 0 && next >= 0) xs.back().limit = &xs[recv_i].done;  // xs no longer grows
  return Progress(xs.data(), static_cast<int>(xs.size()));
}

absl::Status CpuBackend::AllGather(const char* in, char* out, size_t count) {
  const int n = o_.size, r = o_.rank, next = Mod(r + 1, n), prev = Mod(r - 1, n);
  const size_t bytes = count * esize_;
  if (bytes && out + r * bytes != in) std::memmove(out + r * bytes, in, bytes);
  for (int s = 0; s < n - 1; ++s) {
    int sb = Mod(r - s, n), rb = Mod(r - s - 1, n);
    RETURN_IF_ERROR(Exchange(next, out + sb * bytes, bytes, prev, out + rb * bytes, bytes,
                             Xfer::kRecvCopy));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ReduceScatter(const char* in, char* out, size_t count) {
  const int n = o_.size, r = o_.rank;
  const size_t bytes = count * esize_;
  // Work on a copy of the input (the caller's `in` is const); blocks of `count` elements.
  if (scratch_.size() < bytes * n) scratch_.resize(bytes * n);
  if (bytes) std::memcpy(scratch_.data(), in, bytes * n);
  RETURN_IF_ERROR(RingReduceScatterInPlace(scratch_.data(), count * n, 0));
  // With count*n elements split in n chunks, chunk r is exactly block r.
  if (bytes) std::memcpy(out, scratch_.data() + r * bytes, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::AllToAll(const char* in, char* out, size_t count) {
  const int n = o_.size, r = o_.rank;
  const size_t bytes = count * esize_;
  if (bytes) std::memcpy(out + r * bytes, in + r * bytes, bytes);
  for (int s = 1; s < n; ++s) {
    int to = Mod(r + s, n), from = Mod(r - s, n);
    RETURN_IF_ERROR(Exchange(to, in + to * bytes, bytes, from, out + from * bytes, bytes,
                             Xfer::kRecvCopy));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Direct shared-memory collectives
//
// Every op starts with a sync at which all ranks publish their op header and check every peer's,
// so a mismatch fails on every rank before any data moves. Data moves in chunks of at most one
// staging slot per rank: the owner copies its chunk into its slot before entering a sync, and after
// the sync every rank reads the slots it needs in place (a peer's slot is in our address space).
// - all_gather / broadcast: copy in, sync, copy every rank's (the root's) slot out. One sync per
//   chunk.
// - reduce_scatter: each rank stages the matching piece of all N blocks; rank r then reduces
//   piece r of every rank's slot into its output (ReduceMany: all N inputs at once, rank order,
//   16-bit floats in f32 with one rounding). One sync per chunk.
// - all_reduce: small (at most small_bytes and one slot): every rank reduces the whole buffer from
//   all slots, one sync. Large: rank r reduces slice r of the chunk in place in its own slot, stages
//   the next chunk, syncs, and copies the N reduced slices out: one sync per chunk, plus one.
// - Beyond one slot per rank, all_reduce of wider types, all_gather, broadcast and all_to_all run
//   the channel algorithms after the header sync (see RunDirect).
// Waits use the collective doorbell and check abort and peer liveness like the channel path.

absl::Status CpuBackend::DirectWait(uint64_t v) {
  const int n = o_.size, r = o_.rank;
  ShmWaiter waiter(bell(0), &coll_spin_);
  while (true) {
    if (aborted()) return AbortStatus();
    int lag = -1;
    for (int p = 0; p < n && lag < 0; ++p)
      if (p != r && ctl(p)->sync.load(std::memory_order_acquire) < v) lag = p;
    if (lag < 0) return absl::OkStatus();
    // Direct collectives write nothing to the collective channel (the channel algorithms that
    // large ops use consume all they receive before they return): Peek only checks that the peer
    // is alive and has not shut the channel down (aborted).
    absl::StatusOr<ReadSpan> s = peers_[lag].coll->Peek(0);
    if (!s.ok()) {
      if (aborted()) return AbortStatus();
      return base::Annotate(s.status(), absl::StrCat("group '", o_.group_name, "' rank ", o_.rank,
                                                     " waiting for rank ", lag, " in ",
                                                     DescribeHeader(hdr_)));
    }
    waiter.Idle();
  }
}

absl::Status CpuBackend::DirectSync(uint64_t* entered) {
  const int n = o_.size, r = o_.rank;
  const uint64_t v = ++direct_sync_;
  if (entered) *entered = v;
  DirectCtl* mine = ctl(r);
  mine->slot[v & 1].hdr = hdr_;
  mine->sync.store(v, std::memory_order_release);
  for (int p = 0; p < n; ++p)
    if (p != r) RingDoorbell(peer_segs_[p]->doorbell(0));
  RETURN_IF_ERROR(DirectWait(v));
  for (int p = 0; p < n; ++p)
    if (p != r) RETURN_IF_ERROR(CheckHeader(p, ctl(p)->slot[v & 1].hdr));
  return absl::OkStatus();
}

absl::Status CpuBackend::DirectGather(const char* in, char* out, size_t bytes, int root) {
  const int n = o_.size, r = o_.rank;
  const size_t step = DirectStageBytes(o_);
  for (size_t off = 0;; off += step) {
    const size_t m = std::min(step, bytes - off);
    const uint64_t v = direct_sync_ + 1;
    if (m && (root < 0 || r == root)) std::memcpy(stage(r, v), in + off, m);
    RETURN_IF_ERROR(DirectSync());
    for (int p = 0; p < n && m; ++p) {
      if (root >= 0 && (p != root || r == root)) continue;
      std::memcpy(out + (root < 0 ? p * bytes : 0) + off, stage(p, v), m);
    }
    if (off + m >= bytes) return absl::OkStatus();
  }
}

absl::Status CpuBackend::DirectReduceScatter(const char* in, char* out, size_t count) {
  const int n = o_.size, r = o_.rank;
  const int avg = reduce_ == ReduceOp::kAvg ? n : 0;
  const size_t step = std::max<size_t>(1, DirectStageBytes(o_) / (n * esize_));
  std::vector<const void*> srcs(n);
  for (size_t off = 0;; off += step) {
    const size_t m = std::min(step, count - off);
    const uint64_t v = direct_sync_ + 1;
    // Slot layout: piece p (m elements of block p) at p * m.
    for (int p = 0; p < n && m; ++p)
      std::memcpy(stage(r, v) + p * m * esize_, in + (p * count + off) * esize_, m * esize_);
    RETURN_IF_ERROR(DirectSync());
    for (int p = 0; p < n; ++p) srcs[p] = stage(p, v) + r * m * esize_;
    ReduceMany(out + off * esize_, srcs.data(), n, m, dtype_, reduce_, avg);
    if (off + m >= count) return absl::OkStatus();
  }
}

absl::Status CpuBackend::DirectAllReduce(char* buf, size_t count) {
  const int n = o_.size, r = o_.rank;
  const int avg = reduce_ == ReduceOp::kAvg ? n : 0;
  const size_t step = DirectStageBytes(o_) / esize_;
  std::vector<const void*> srcs(n);
  uint64_t v = direct_sync_ + 1;
  if (count * esize_ <= std::min(DirectStageBytes(o_), o_.small_bytes)) {
    if (count) std::memcpy(stage(r, v), buf, count * esize_);
    RETURN_IF_ERROR(DirectSync());
    for (int p = 0; p < n; ++p) srcs[p] = stage(p, v);
    ReduceMany(buf, srcs.data(), n, count, dtype_, reduce_, avg);
    return absl::OkStatus();
  }
  // Large: chunk k's inputs are in the slots of sync v; its reduced slices are published with
  // the sync that also publishes chunk k + 1's inputs.
  std::memcpy(stage(r, v), buf, std::min(step, count) * esize_);
  RETURN_IF_ERROR(DirectSync(&v));
  for (size_t off = 0;;) {
    const size_t m = std::min(step, count - off);
    const size_t lo = ChunkOff(m, n, r), hi = ChunkOff(m, n, r + 1);
    for (int p = 0; p < n; ++p) srcs[p] = stage(p, v) + lo * esize_;
    ReduceMany(stage(r, v) + lo * esize_, srcs.data(), n, hi - lo, dtype_, reduce_, avg);
    const size_t next = off + m, next_m = std::min(step, count - next);
    if (next_m) std::memcpy(stage(r, v + 1), buf + next * esize_, next_m * esize_);
    RETURN_IF_ERROR(DirectSync());
    for (int p = 0; p < n; ++p) {
      const size_t plo = ChunkOff(m, n, p), phi = ChunkOff(m, n, p + 1);
      std::memcpy(buf + (off + plo) * esize_, stage(p, v) + plo * esize_, (phi - plo) * esize_);
    }
    if (!next_m) return absl::OkStatus();
    off = next;
    ++v;
  }
}

absl::Status CpuBackend::RunDirect(const OpDesc& op) {
  const int n = o_.size;
  const size_t count = op.count, bytes = count * esize_;
  char* out = static_cast<char*>(op.out);
  const char* in = static_cast<const char*>(op.in);
  // Beyond one staging slot per rank, moving data through the rings copies less than staging
  // (ring all_reduce: 2(N-1)/N copies of the buffer; staged: about 3), so large all_reduce (except
  // of 16-bit floats, which need the one rounding), all_gather and broadcast use the channel
  // algorithms after the header sync. docs/comm.md has the measurements.
  const bool wide = bytes > DirectStageBytes(o_);
  const bool half = dtype_ == DataType::kBF16 || dtype_ == DataType::kF16;
  switch (op.type) {
    case OpType::kBarrier:
    case OpType::kGroupCreate:
      return DirectSync();
    case OpType::kAllReduce:
      if (wide && !half) {
        RETURN_IF_ERROR(DirectSync());
        RETURN_IF_ERROR(RingAllReduce(out, count));
        if (reduce_ == ReduceOp::kAvg) FinishAvg(out, count, dtype_, n);
        return absl::OkStatus();
      }
      return DirectAllReduce(out, count);
    case OpType::kReduceScatter:
      return DirectReduceScatter(in, out, count);
    case OpType::kAllGather:
      if (wide) {
        RETURN_IF_ERROR(DirectSync());
        return AllGather(in, out, count);
      }
      return DirectGather(in, out, bytes, -1);
    case OpType::kBroadcast:
      if (wide) {
        RETURN_IF_ERROR(DirectSync());
        return Broadcast(out, count, op.root);
      }
      return DirectGather(out, out, bytes, op.root);
    case OpType::kAllToAll: {
      const uint64_t v = direct_sync_ + 1;
      if (bytes * n <= DirectStageBytes(o_)) {
        if (bytes) std::memcpy(stage(o_.rank, v), in, bytes * n);
        RETURN_IF_ERROR(DirectSync());
        for (int p = 0; p < n && bytes; ++p)
          std::memcpy(out + p * bytes, stage(p, v) + o_.rank * bytes, bytes);
        return absl::OkStatus();
      }
      // Large: headers checked at the sync, then the pairwise exchange over the channels.
      RETURN_IF_ERROR(DirectSync());
      return AllToAll(in, out, count);
    }
    default:
      return absl::InvalidArgumentError("not a collective");
  }
}

// ---------------------------------------------------------------------------------------------
// P2P engine

void P2PEngine::Post(bool send, char* data, size_t bytes, int peer, int tag,
                     std::function<void(absl::Status)> done) {
  auto op = std::make_shared<Op>();
  op->buf = data;
  op->bytes = bytes;
  op->tag = tag;
  op->cb = std::move(done);
  absl::Status fail;
  bool complete = false;
  {
    absl::MutexLock l(&mu_);
    if (!failed_.ok()) {
      fail = failed_;
    } else if (send) {
      op->hdr.tag = tag;
      op->hdr.bytes = bytes;
      sendq_[peer].push_back(op);
    } else {
      // An unexpected message already here?
      auto& uq = unexpected_[peer];
      auto it = std::find_if(uq.begin(), uq.end(),
                             [&](const Unexpected& u) { return u.complete && u.tag == tag; });
      if (it != uq.end()) {
        if (it->data.size() != bytes) {
          fail = absl::InvalidArgumentError(absl::StrCat(
              "recv from rank ", peer, " tag ", tag, " expects ", bytes, " bytes but the peer sent ",
              it->data.size()));
        } else {
          if (bytes) std::memcpy(data, it->data.data(), bytes);
          complete = true;
        }
        uq.erase(it);
      } else {
        posted_[peer].push_back(op);
      }
    }
  }
  if (!fail.ok()) {
    op->cb(fail);
  } else if (complete) {
    op->cb(absl::OkStatus());
  } else {
    Wake();
  }
}

void P2PEngine::Wake() {
  if (Doorbell* b = be_->bell(1)) RingDoorbell(b);
}

void P2PEngine::FailAll(const absl::Status& s) {
  std::vector<std::function<void(absl::Status)>> cbs;
  {
    absl::MutexLock l(&mu_);
    if (failed_.ok()) failed_ = s;
    for (auto& q : sendq_) {
      for (auto& op : q) cbs.push_back(std::move(op->cb));
      q.clear();
    }
    for (auto& q : posted_) {
      for (auto& op : q) cbs.push_back(std::move(op->cb));
      q.clear();
    }
    for (auto& in : in_) in.op.reset();
  }
  for (auto& cb : cbs)
    if (cb) cb(s);
}

bool P2PEngine::AnyPendingLocked() const {
  for (const auto& q : sendq_)
    if (!q.empty()) return true;
  for (const auto& q : posted_)
    if (!q.empty()) return true;
  for (const auto& in : in_)
    if (in.active || in.hdr_got > 0) return true;
  return false;
}

bool P2PEngine::ProgressLocked(
    std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>* done) {
  bool progressed = false;
  const int n = static_cast<int>(sendq_.size());
  for (int p = 0; p < n; ++p) {
    Channel* ch = be_->peer(p).p2p.get();
    if (!ch || dead_[p]) continue;
    absl::Status err;
    // Sends: header, then payload, one message at a time per peer.
    while (!sendq_[p].empty() && err.ok()) {
      Op& op = *sendq_[p].front();
      if (!op.hdr_sent) {
        // The header goes as one unit; TrySend may take part of it, so track via done.
        size_t off = op.done;
        absl::StatusOr<size_t> k =
            ch->TrySend(reinterpret_cast<char*>(&op.hdr) + off, sizeof(P2PHeader) - off);
        if (!k.ok()) { err = k.status(); break; }
        op.done += *k;
        progressed |= *k > 0;
        if (op.done < sizeof(P2PHeader)) break;
        op.hdr_sent = true;
        op.done = 0;
      }
      if (op.done < op.bytes) {
        absl::StatusOr<size_t> k = ch->TrySend(op.buf + op.done, std::min(op.bytes - op.done, kStepBytes));
        if (!k.ok()) { err = k.status(); break; }
        op.done += *k;
        progressed |= *k > 0;
      }
      if (op.done < op.bytes) break;
      done->emplace_back(std::move(op.cb), absl::OkStatus());
      sendq_[p].pop_front();
    }
    // Receives: read a header, route the payload.
    for (int guard = 0; guard < 64 && err.ok(); ++guard) {
      Incoming& in = in_[p];
      if (!in.active) {
        absl::StatusOr<size_t> k = ch->TryRecv(reinterpret_cast<char*>(&in.hdr) + in.hdr_got,
                                               sizeof(P2PHeader) - in.hdr_got);
        if (!k.ok()) { err = k.status(); break; }
        in.hdr_got += *k;
        progressed |= *k > 0;
        if (in.hdr_got < sizeof(P2PHeader)) break;
        in.hdr_got = 0;
        if (in.hdr.magic != kP2PMagic) {
          err = absl::InternalError(absl::StrCat("p2p stream from rank ", p, " is out of sync"));
          break;
        }
        in.active = true;
        in.remaining = in.hdr.bytes;
        in.op.reset();
        in.dst = nullptr;
        in.to_unexpected = false;
        auto& pq = posted_[p];
        auto it = std::find_if(pq.begin(), pq.end(),
                               [&](const std::shared_ptr<Op>& o) { return o->tag == in.hdr.tag; });
        if (it != pq.end()) {
          std::shared_ptr<Op> op = *it;
          pq.erase(it);
          if (op->bytes != in.hdr.bytes) {
            done->emplace_back(std::move(op->cb),
                               absl::InvalidArgumentError(absl::StrCat(
                                   "recv from rank ", p, " tag ", in.hdr.tag, " expects ",
                                   op->bytes, " bytes but the peer sent ", in.hdr.bytes)));
          } else {
            in.op = op;
            in.dst = op->buf;
          }
        } else {
          unexpected_[p].push_back(Unexpected{in.hdr.tag, std::vector<char>(in.hdr.bytes)});
          in.dst = unexpected_[p].back().data.data();
          in.to_unexpected = true;
        }
      }
      if (in.remaining > 0) {
        size_t k;
        if (in.dst) {
          absl::StatusOr<size_t> r =
              ch->TryRecv(in.dst + (in.hdr.bytes - in.remaining), std::min(in.remaining, kStepBytes));
          if (!r.ok()) { err = r.status(); break; }
          k = *r;
        } else {
          char sink[4096];
          absl::StatusOr<size_t> r = ch->TryRecv(sink, std::min(in.remaining, sizeof(sink)));
          if (!r.ok()) { err = r.status(); break; }
          k = *r;
        }
        in.remaining -= k;
        progressed |= k > 0;
        if (in.remaining > 0) break;
      }
      in.active = false;
      if (in.op) {
        done->emplace_back(std::move(in.op->cb), absl::OkStatus());
        in.op.reset();
      } else if (in.to_unexpected) {
        // An unexpected message is complete; a matching recv may have been posted meanwhile.
        Unexpected& u = unexpected_[p].back();
        u.complete = true;
        auto& pq = posted_[p];
        auto it = std::find_if(pq.begin(), pq.end(),
                               [&](const std::shared_ptr<Op>& o) { return o->tag == u.tag; });
        if (it != pq.end()) {
          std::shared_ptr<Op> op = *it;
          pq.erase(it);
          if (op->bytes != u.data.size()) {
            done->emplace_back(std::move(op->cb),
                               absl::InvalidArgumentError(absl::StrCat(
                                   "recv from rank ", p, " tag ", u.tag, " expects ", op->bytes,
                                   " bytes but the peer sent ", u.data.size())));
          } else {
            if (op->bytes) std::memcpy(op->buf, u.data.data(), op->bytes);
            done->emplace_back(std::move(op->cb), absl::OkStatus());
          }
          unexpected_[p].pop_back();
        }
      }
    }
    if (!err.ok()) {
      // The peer is gone: fail what involves it.
      absl::Status s = base::Annotate(err, absl::StrCat("p2p with rank ", p));
      for (auto& op : sendq_[p]) done->emplace_back(std::move(op->cb), s);
      sendq_[p].clear();
      for (auto& op : posted_[p]) done->emplace_back(std::move(op->cb), s);
      posted_[p].clear();
      if (in_[p].op) done->emplace_back(std::move(in_[p].op->cb), s);
      in_[p] = Incoming();
      dead_[p] = true;  // stop polling it
    }
  }
  return progressed;
}

void P2PEngine::Loop() {
  int idle = 0;
  Doorbell* bell = be_->bell(1);
  ShmWaiter waiter(bell, be_->p2p_spin());
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>> done;
  std::vector<pollfd> fds;
  while (true) {
    bool progressed;
    bool any_shm = false;
    {
      absl::MutexLock l(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || AnyPendingLocked();
      };
      bool (*cond)(decltype(wake)*) = [](decltype(wake)* w) { return (*w)(); };
      if (!wake()) {
        waiter.Busy();
        mu_.AwaitWithTimeout(absl::Condition(cond, &wake), absl::Milliseconds(50));
        idle = 0;
      }
      if (stop_) break;
      if (!failed_.ok()) {
        idle = 0;
        continue;
      }
      progressed = ProgressLocked(&done);
      fds.clear();
      for (size_t p = 0; p < sendq_.size(); ++p) {
        Channel* ch = be_->peer(static_cast<int>(p)).p2p.get();
        if (!ch || dead_[p]) continue;
        if (ch->is_shm()) {
          any_shm = true;
        } else {
          fds.push_back({ch->fd(), static_cast<short>(POLLIN | (sendq_[p].empty() ? 0 : POLLOUT)), 0});
        }
      }
    }
    for (auto& d : done)
      if (d.first) d.first(d.second);
    done.clear();
    if (progressed) {
      idle = 0;
      waiter.Busy();
      continue;
    }
    if (any_shm && fds.empty() && bell) {
      waiter.Idle();  // Post() and Stop() ring the doorbell too
      continue;
    }
    waiter.Busy();
    ++idle;
    if (any_shm) fds.clear();
    CpuBackend::Backoff(idle, fds);
  }
}

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(BackendOptions options) {
  return std::make_unique<CpuBackend>(std::move(options));
}

}  // namespace ember::comm
