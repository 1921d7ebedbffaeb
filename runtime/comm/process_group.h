// ProcessGroup: a set of ranks that run collectives and tagged point-to-point ops together.
//
// A group is created through the rendezvous store (a job/attempt-scoped view) with a backend name:
// "cpu", or the device backends "nccl", "nccl-lazy", "nccl-legacy" (device_backend.h: their
// communicator policy; NCCL itself only in builds with CUDA, else GroupOptions::comm_driver). Store keys
// derive from the group name: pg/<name>/... . Every rank must create groups and issue collectives
// on a group in the same order (like c10d/NCCL); mismatches are detected by a per-op descriptor
// exchange and fail with INVALID_ARGUMENT instead of corrupting memory.
//
// Thread-safety: all methods are thread-safe. Collectives on one group run in issue order; calls
// return a Work immediately (small ops issued while the group is idle run inline on the caller's
// thread for latency). Send/Recv are matched per (peer, tag) in issue order and may overlap
// collectives. Buffers must stay valid until the Work completes.
//
//   auto rdzv = MakeStoreRendezvous(client.WithPrefix("jobs/j1/attempt/0/"));
//   ASSIGN_OR_RETURN(auto pg, ProcessGroup::Create(rdzv, rank, world, {.name = "world",
//                                                  .recorder = &recorder}));
//   RETURN_IF_ERROR(pg->AllReduce(grads, n, DataType::kBF16, ReduceOp::kAvg)->Wait());
//
// Failure: each op has a timeout (GroupOptions::timeout, or OpOptions::timeout). The watchdog
// fails a stuck op with DEADLINE_EXCEEDED naming the op, group, seq and sizes, aborts the group
// (every later op fails with ABORTED), sets the store key fr/dump_request so every rank dumps its
// flight recorder to <dump_dir>/rank-<global rank>.json. A peer that dies makes pending ops fail
// with UNAVAILABLE within milliseconds.
#ifndef EMBER_RUNTIME_COMM_PROCESS_GROUP_H_
#define EMBER_RUNTIME_COMM_PROCESS_GROUP_H_

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/comm/backend.h"
#include "runtime/comm/comm_driver.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/comm/types.h"
#include "runtime/comm/work.h"
#include "runtime/flight/recorder.h"

namespace ember::comm {

struct GroupOptions {
  std::string name = "world";
  std::string backend = "cpu";
  absl::Duration timeout = absl::Minutes(10);           // per op unless OpOptions says otherwise
  absl::Duration bootstrap_timeout = absl::Minutes(5);
  flight::FlightRecorder* recorder = nullptr;           // borrowed; may be null (no recording)
  std::string dump_dir;        // where rank-<r>.json goes; "" = $EMBER_FR_DUMP_DIR, else no file
  int global_rank = -1;        // this process's world rank for dump names; -1 = group rank
  std::vector<int> global_ranks;  // members' world ranks (filled for subgroups)
  bool enable_shm = true;      // also off when EMBER_COMM_DISABLE_SHM=1
  std::string host;            // address peers dial; "" = $EMBER_COMM_HOST or 127.0.0.1
  size_t shm_ring_bytes = 1 << 20;
  size_t small_bytes = 64 << 10;        // latency-optimal algorithms at or below this size
  size_t inline_max_bytes = 256 << 10;  // run on the caller's thread when idle, at or below this
  std::string device = "cpu";  // device binding (cuda:N for device backends)
  bool lazy_init = false;      // connect on the first op instead of in Create
  // Device backends: the communicator library. Null = NCCL (UNIMPLEMENTED in a build without it);
  // CPU-only tests pass a CpuCommDriver (cpu_comm_driver.h) to run the policy on cpu communicators.
  std::shared_ptr<CommDriver> comm_driver;
  absl::Duration watchdog_period = absl::Milliseconds(100);
  absl::Duration dump_poll_period = absl::Milliseconds(400);
};

struct OpOptions {
  absl::Duration timeout = absl::ZeroDuration();  // zero = the group's
  std::string tag;                                // recorded in the flight recorder
};

class ProcessGroup {
 public:
  // Bootstraps the group (unless lazy_init): publishes this rank's address under
  // pg/<name>/peer/<rank>, waits for all peers, connects. UNIMPLEMENTED for unknown backends,
  // DEADLINE_EXCEEDED if peers do not show up within bootstrap_timeout.
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Create(std::shared_ptr<Rendezvous> rdzv,
                                                              int rank, int size,
                                                              GroupOptions options);
  // Fails queued ops with ABORTED, stops the threads, closes connections.
  ~ProcessGroup();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return opts_.name; }
  std::string Describe() const;

  // In place: buf (count elements) becomes op over all ranks.
  std::shared_ptr<Work> AllReduce(void* buf, size_t count, DataType t, ReduceOp op,
                                  OpOptions o = {});
  std::shared_ptr<Work> Broadcast(void* buf, size_t count, DataType t, int root, OpOptions o = {});
  // out (size*count) = concat of every rank's in (count).
  std::shared_ptr<Work> AllGatherSingle(const void* in, void* out, size_t count, DataType t,
                                        OpOptions o = {});
  // in (size*count); out (count) = op over ranks of block `rank` of in.
  std::shared_ptr<Work> ReduceScatterSingle(const void* in, void* out, size_t count, DataType t,
                                            ReduceOp op, OpOptions o = {});
  // in/out (size*count): out block j = rank j's in block `rank`.
  std::shared_ptr<Work> AllToAllSingle(const void* in, void* out, size_t count, DataType t,
                                       OpOptions o = {});
  std::shared_ptr<Work> Barrier(OpOptions o = {});
  // Tagged point-to-point; messages from one peer with one tag arrive in order. A size mismatch
  // fails the Recv with INVALID_ARGUMENT.
  std::shared_ptr<Work> Send(const void* data, size_t count, DataType t, int dst, int tag,
                             OpOptions o = {});
  std::shared_ptr<Work> Recv(void* data, size_t count, DataType t, int src, int tag,
                             OpOptions o = {});

  // Collective over this group (every rank calls it). Returns the new group, or nullptr on ranks
  // that are not members. new_group: `ranks` are group ranks, identical on every rank.
  // The child inherits this group's options; its name is `name` if given, else derived from
  // this group's name and the creating op's sequence number (identical on every rank).
  absl::StatusOr<std::unique_ptr<ProcessGroup>> NewGroup(const std::vector<int>& ranks,
                                                         const std::string& name = "");
  // Ranks with the same color form a group, ordered by (key, rank); color < 0 = not a member.
  absl::StatusOr<std::unique_ptr<ProcessGroup>> Split(int color, int key,
                                                      const std::string& name = "");
  // Device backends split through the library (ncclCommSplit): every rank takes part, a
  // non-member gets nullptr (never a hang; a rank that does not take part makes the members fail
  // after bootstrap_timeout). Queued ops of this group run first.

  // Called by the survivors only (excluded ranks may be dead; this group may be aborted): a new
  // group of this group's ranks minus `excluded_ranks`, renumbered in order. cpu: bootstrapped
  // through the store; nccl*: ncclCommShrink. Its name is `name`, else
  // <this name>.shrink<n>.x<excluded> (n counts this group's shrinks). INVALID_ARGUMENT if this
  // rank is excluded or the ranks are not distinct ranks of the group.
  absl::StatusOr<std::unique_ptr<ProcessGroup>> Shrink(const std::vector<int>& excluded_ranks,
                                                       const std::string& name = "");
  // Bytes the communication library holds outside any allocator (cpu: its shared-memory segment).
  size_t CommMemoryBytes() const { return backend_ ? backend_->MemoryBytes() : 0; }

  // Fails the running and queued ops with ABORTED(why) and unblocks every thread.
  void Abort(absl::string_view why);
  // Writes this process's recorder to `path` ("" = <dump_dir>/rank-<r>.json).
  absl::Status DumpFlightRecorder(const std::string& path = "");

  struct PendingOp;  // internal

 private:
  ProcessGroup(std::shared_ptr<Rendezvous> rdzv, int rank, int size, GroupOptions options);
  static absl::Status CheckAndDefault(int rank, int size, GroupOptions* options);
  // Takes a backend that is already connected (device split/shrink results).
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateWithBackend(
      std::shared_ptr<Rendezvous> rdzv, int rank, int size, GroupOptions options,
      std::unique_ptr<Backend> backend);
  BackendOptions MakeBackendOptions(int rank, int size, const std::string& name) const;
  absl::Status Init(std::unique_ptr<Backend> given);
  absl::Status EnsureConnected();
  std::shared_ptr<Work> Submit(OpDesc op, size_t bytes, OpOptions o);
  std::shared_ptr<Work> SubmitP2P(bool send, void* data, size_t count, DataType t, int peer,
                                  int tag, OpOptions o);
  void Execute(PendingOp* op);
  void ExecutorLoop();
  void WatchdogLoop();
  void RecordDeviceTimes();  // watchdog thread
  void OnTimeout(const std::string& message);
  void DumpIfRequested(const std::string& reason_key, const std::string& reason);
  absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateSubgroup(const std::string& name,
                                                               const std::vector<int>& members);
  GroupOptions ChildOptions(const std::string& name, const std::vector<int>& members) const;
  absl::StatusOr<std::unique_ptr<ProcessGroup>> DeviceSplit(int color, int key,
                                                            const std::string& name,
                                                            const char* kind,
                                                            const std::vector<int>& members);
  int DumpRank() const { return opts_.global_rank >= 0 ? opts_.global_rank : rank_; }
  std::string DumpPath() const;

  // Constant after construction.
  const std::shared_ptr<Rendezvous> rdzv_;
  const int rank_, size_;
  GroupOptions opts_;
  std::string prefix_;  // pg/<name>/
  int fr_group_ = -1;
  std::unique_ptr<Backend> backend_;

  absl::Mutex connect_mu_;
  bool connected_ ABSL_GUARDED_BY(connect_mu_) = false;
  std::atomic<bool> connected_fast_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<int64_t> p2p_seq_{0};
  std::atomic<int> shrinks_{0};

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_completed_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::shared_ptr<PendingOp>> queue_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<PendingOp> running_ ABSL_GUARDED_BY(mu_);  // on executor or inline
  std::vector<std::shared_ptr<PendingOp>> p2p_pending_ ABSL_GUARDED_BY(mu_);
  // Device ops whose events have not reported their device times yet (record id, events).
  std::vector<std::pair<uint64_t, std::shared_ptr<DeviceEvents>>> device_timed_ ABSL_GUARDED_BY(mu_);
  uint64_t last_signal_count_ = 0;  // watchdog thread only

  std::thread executor_;
  std::thread watchdog_;
};

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_PROCESS_GROUP_H_
