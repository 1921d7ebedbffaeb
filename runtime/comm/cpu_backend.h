// CpuBackend: the "cpu" Backend (backend.h) and what its source files share. Internal to
// //runtime/comm:comm; MakeCpuBackend (backend.h) is the public way in.
//
// The backend's parts, one file each:
// - cpu_backend.cc: bootstrap (Connect: TCP dial/accept, shm segment mapping, the verdicts on shm
//   and direct collectives), Abort, Describe.
// - channel_collectives.cc: the progress loop over channels (Xfer), the op header exchange, Run,
//   and the channel algorithms (ring, recursive doubling, binomial tree, pairwise exchange).
// - direct_collectives.cc: the direct shared-memory collectives (every peer on shm).
// - p2p_engine.{h,cc}: tagged point-to-point (PostSend/PostRecv), on its own thread.
// - progress_wait.{h,cc}: how the loops wait (shm doorbell, TCP poll).
// - the transports: shm_ring.{h,cc} and tcp.{h,cc} behind channel.h.
// The element-wise reduce kernels are in types.{h,cc}.
//
// Two families of collectives:
// - Direct (every peer on shared memory): each rank copies its input into a staging slot of its
//   own shm segment, and every rank reads its peers' slots in place; a rank reduces all N inputs
//   of its slice at once (16-bit floats in f32, one rounding). Large messages stream through the
//   slots chunk by chunk. See direct_collectives.cc.
// - Channel (TCP, or mixed groups): byte streams over rings/sockets; ring for large messages,
//   recursive doubling, binomial tree and pairwise exchange for small ones.
//
// Thread safety: as Backend (backend.h). Run and everything it calls (the collective state below)
// run on the executor thread only; the p2p engine has its own thread; Abort may come from any.
#ifndef EMBER_RUNTIME_COMM_CPU_BACKEND_H_
#define EMBER_RUNTIME_COMM_CPU_BACKEND_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime/comm/backend.h"
#include "runtime/comm/channel.h"
#include "runtime/comm/p2p_engine.h"
#include "runtime/comm/progress_wait.h"
#include "runtime/comm/shm_ring.h"
#include "runtime/comm/tcp.h"

namespace ember::comm::internal {

constexpr uint32_t kHelloMagic = 0x454d4231;   // "EMB1"
constexpr uint32_t kOpMagic = 0x454d4f50;      // "EMOP"

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
size_t DirectStageBytes(const BackendOptions& o);
// False when EMBER_COMM_SHM_DIRECT=0 turns the direct collectives off.
bool DirectAllowedByEnv();

// "all_reduce seq 3 count 10 f32 sum": an op header for error messages.
std::string DescribeHeader(const OpHeader& h);

// Start of chunk i when `count` elements are split in n chunks (chunk sizes differ by at most 1).
inline size_t ChunkOff(size_t count, int n, int i) { return count * i / n; }
inline int Mod(int a, int n) { return ((a % n) + n) % n; }

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

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(BackendOptions o) : o_(std::move(o)), peers_(o_.size), p2p_(o_.size) {}
  ~CpuBackend() override;

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
  void Abort(const absl::Status& why) override;
  std::string Describe() const override;
  // This rank's shared-memory segment (rings and direct-collective stages), once connected.
  size_t MemoryBytes() const override { return memory_bytes_.load(std::memory_order_acquire); }

 private:
  bool aborted() const { return abort_.load(std::memory_order_relaxed); }
  absl::Status AbortStatus() {
    absl::MutexLock l(&abort_mu_);
    return abort_status_.ok() ? absl::AbortedError("group aborted") : abort_status_;
  }
  // Own doorbell of a channel kind (0 collective, 1 p2p), or null without shm.
  Doorbell* bell(int kind) const { return my_seg_ ? my_seg_->doorbell(kind) : nullptr; }

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
  // The ring's reduce-scatter steps, then (all_gather) its all-gather steps, as one pipelined
  // stream (channel_collectives.cc says why it is safe).
  absl::Status RingPipelined(char* buf, size_t count, int owner_shift, bool all_gather);
  absl::Status ReduceScatter(const char* in, char* out, size_t count);
  absl::Status AllToAll(const char* in, char* out, size_t count);
  absl::Status Exchange(int send_peer, const char* send, size_t send_bytes, int recv_peer,
                        char* recv, size_t recv_bytes, Xfer::Kind recv_kind,
                        const size_t* limit = nullptr);

  const BackendOptions o_;
  std::vector<Peer> peers_;
  std::unique_ptr<TcpListener> listener_;
  std::unique_ptr<ShmSegment> my_seg_;
  std::atomic<size_t> memory_bytes_{0};  // my_seg_'s size, published at the end of Connect
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

}  // namespace ember::comm::internal

#endif  // EMBER_RUNTIME_COMM_CPU_BACKEND_H_
