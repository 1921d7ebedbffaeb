// CommDriver: the thin layer under the device backends ("nccl", "nccl-lazy", "nccl-legacy").
// It only wraps library calls (NCCL: ncclCommInitRankConfig, ncclCommSplit, ncclCommShrink,
// ncclCommAbort, ncclCommGetAsyncError, ncclAllReduce/ncclSend/..., CUDA streams and events); every
// decision (when to create which communicator, how ids travel through the store, what to abort
// together) is in the policy layer, device_backend.{h,cc}, written once. Two drivers exist:
// nccl_driver.cc (device builds, EMBER_WITH_NCCL) and cpu_comm_driver.cc (the cpu backend's
// communicators, so CPU-only tests run the same policy code with real processes).
//
// Thread-safety: a driver is thread-safe. A Communicator's Collective/EndOp/PostSend/PostRecv are
// called by one thread at a time per communicator; AsyncError, Revoke and MemoryBytes from any
// thread. Init, Split and Shrink wait until the new communicator is ready (non-blocking init
// polled to completion; on failure only the new handle is aborted, never the parent).
#ifndef EMBER_RUNTIME_COMM_COMM_DRIVER_H_
#define EMBER_RUNTIME_COMM_COMM_DRIVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/comm/backend.h"
#include "runtime/comm/work.h"

namespace ember::comm {

// NCCL's ncclInProgress: a call on a non-blocking communicator (blocking = 0) returned before it
// finished. Until ncclCommGetAsyncError (Communicator::AsyncError) stops returning in progress the
// work is not enqueued on the stream: no other call may be made on that communicator and no event
// recorded behind it. The policy (device_backend.cc) polls; drivers only report it.
absl::Status InProgressError(absl::string_view what);
bool IsInProgress(const absl::Status& s);

// One rank's handle on a set of ranks (an ncclComm_t and the stream its ops go to).
//
// Lifetime (NCCL 2.28): Revoke (ncclCommRevoke) stops pending and later ops but keeps the handle
// valid, so other threads may still call it and Shrink/Split/destroy can follow once AsyncError
// is OK again (quiescent). Abort (ncclCommAbort) frees the handle: every later call on it is
// invalid (undefined behaviour on NCCL; the cpu fake fails the process loudly). The destructor
// frees a handle that is still held (finalize + destroy, or abort if it was revoked or in error).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Makes the communicator's stream wait on op.stream (the caller's), records the op's start event
  // there and enqueues the collective. OK (enqueued), in progress (IsInProgress: poll AsyncError
  // until OK, then EndOp) or an error.
  virtual absl::Status Collective(const OpDesc& op) = 0;
  // After the last call completed (returned OK, or AsyncError returned OK after in progress):
  // p2p = false: records the collective's end event and returns its events (nullptr under CUDA
  // graph capture of `caller`, which then waits on the op at once); p2p = true: makes `caller`
  // (the submitter's stream) wait on everything enqueued so far and returns nullptr.
  virtual absl::StatusOr<std::shared_ptr<DeviceEvents>> EndOp(void* caller, bool p2p) = 0;
  // Point-to-point; `peer` is a rank of this communicator. `done` is called exactly once (NCCL:
  // when the call returned, with OK, in progress or an error; cpu driver: when the bytes moved).
  virtual void PostSend(const void* data, size_t bytes, int peer, int tag,
                        std::function<void(absl::Status)> done) = 0;
  virtual void PostRecv(void* data, size_t bytes, int peer, int tag,
                        std::function<void(absl::Status)> done) = 0;
  // ncclCommGetAsyncError: OK (idle or the last call completed), in progress, or the error the
  // library reports for this communicator. Any thread.
  virtual absl::Status AsyncError() = 0;
  // ncclCommRevoke: pending and later ops fail promptly; the handle stays valid. Idempotent; any
  // thread.
  virtual void Revoke(const absl::Status& why) = 0;
  // ncclCommAbort: frees the handle now (see Lifetime). Only for a handle no other thread can
  // reach; the policy never calls it (it revokes, and the last reference frees).
  virtual void Abort(const absl::Status& why) = 0;
  // Memory the library holds for this communicator outside any allocator (0 if unknown).
  virtual size_t MemoryBytes() const = 0;
  virtual std::string Describe() const = 0;
};

struct CommInitOptions {
  std::string device = "cpu";                  // "cuda:N" for NCCL
  absl::Duration timeout = absl::Minutes(5);   // non-blocking init: give up after this
  std::string tag;                             // what this communicator is for (logs, tests)
};

class CommDriver {
 public:
  virtual ~CommDriver() = default;
  virtual std::string name() const = 0;
  // A fresh unique id (ncclGetUniqueId), as bytes to publish through the store.
  virtual absl::StatusOr<std::string> NewUniqueId() = 0;
  // Joins the communicator `id` as `rank` of `size` (ncclCommInitRankConfig, non-blocking,
  // DEADLINE_EXCEEDED after o.timeout).
  virtual absl::StatusOr<std::unique_ptr<Communicator>> InitRank(const std::string& id, int rank,
                                                                 int size,
                                                                 const CommInitOptions& o) = 0;
  // Several communicators of this process at once (one per device, ncclGroupStart/End around the
  // inits): ranks[i] joins with devices[i]. The multi-device path of nccl-legacy.
  virtual absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> InitRanks(
      const std::string& id, const std::vector<int>& ranks, int size,
      const std::vector<std::string>& devices, const CommInitOptions& o) = 0;
  // Collective over `parent` (every rank of it calls): ranks with the same color >= 0 form a
  // communicator ordered by (key, rank). color < 0: not a member, returns nullptr (ncclCommSplit
  // with NCCL_SPLIT_NOCOLOR).
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(Communicator& parent, int color,
                                                              int key,
                                                              const CommInitOptions& o) = 0;
  // Called by the survivors only (excluded ranks may be dead): a communicator of the parent's
  // ranks minus `excluded`, renumbered in order (ncclCommShrink, NCCL >= 2.27). The parent must be
  // quiescent (AsyncError not in progress); a revoked parent is valid, a freed (aborted) one not.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Shrink(Communicator& parent,
                                                               const std::vector<int>& excluded,
                                                               const CommInitOptions& o) = 0;
  // Runs several ops of several communicators of this process together (ncclGroupStart/End): the
  // multi-device collectives of nccl-legacy. ops[i] runs on comms[i].
  virtual absl::Status GroupCollective(const std::vector<Communicator*>& comms,
                                       const std::vector<OpDesc>& ops) = 0;
};

// The calling thread's current CUDA stream (a cudaStream_t; null = the default stream). Device ops
// submitted from this thread wait on it before they start (ProcessGroup captures it per op in
// OpDesc::stream), and Work::Wait makes it wait on the op. Thread-local.
void SetCurrentStream(void* stream);
void* CurrentStream();

// The real NCCL driver (nccl_driver.cc). UNIMPLEMENTED unless the binary links
// //runtime/comm:nccl_driver and the build found NCCL (EMBER_WITH_NCCL), so CPU-only binaries
// never load libnccl. The driver checks the CUDA driver, runtime and compute capability of `device`
// first (below sm_75 or a driver older than the runtime: FAILED_PRECONDITION naming the versions
// found and the minimum).
absl::StatusOr<std::shared_ptr<CommDriver>> MakeNcclDriver(const std::string& device);
using CommDriverFactory = absl::StatusOr<std::shared_ptr<CommDriver>> (*)(const std::string&);
// Called once by nccl_driver.cc at static initialization.
void RegisterNcclDriverFactory(CommDriverFactory f);

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_COMM_DRIVER_H_
