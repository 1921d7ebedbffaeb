// Backend: what a transport/algorithm implementation ("cpu"; the device backends "nccl",
// "nccl-lazy", "nccl-legacy" in device_backend.h) provides to ProcessGroup. ProcessGroup owns ordering, sequence numbers,
// the flight recorder, Work and the watchdog; a Backend only moves bytes.
//
// Contract: Run() is called by one thread at a time, in issue order, and blocks until the op is
// done in host terms (cpu: data in place; a device backend: enqueued on its stream, with
// completion reported through the Work it is given later). PostSend/PostRecv are asynchronous
// and may be called from any thread; `done` is called exactly once, on an internal thread.
// Abort() may be called from any thread and makes Run and pending p2p ops fail promptly.
#ifndef EMBER_RUNTIME_COMM_BACKEND_H_
#define EMBER_RUNTIME_COMM_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/comm/types.h"

namespace ember::comm {

class CommDriver;    // comm_driver.h
class DeviceEvents;  // work.h

enum class OpType : uint8_t {
  kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kBarrier, kSend, kRecv,
  kGroupCreate,
};
const char* OpTypeName(OpType t);

struct OpDesc {
  OpType type = OpType::kAllReduce;
  const void* in = nullptr;  // in-place ops (all_reduce, broadcast) use `out` only
  void* out = nullptr;
  size_t count = 0;          // elements; per rank for all_gather/reduce_scatter/all_to_all
  DataType dtype = DataType::kU8;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;              // broadcast
  int64_t seq = 0;           // collective sequence number (same on every rank)
  void* stream = nullptr;    // device backends: the submitting thread's current stream
  // Device backends: the op's deadline once enqueued (its group's watchdog fails it after this;
  // zero: the backend's op_timeout). ProcessGroup sets it from the op's options.
  absl::Duration timeout = absl::ZeroDuration();
};

struct BackendOptions {
  std::string group_name;
  int rank = 0;
  int size = 1;
  std::shared_ptr<Rendezvous> rendezvous;
  std::string key_prefix;              // "pg/<name>/"
  absl::Duration bootstrap_timeout = absl::Minutes(5);
  bool enable_shm = true;
  std::string host = "127.0.0.1";      // address peers use to reach this rank
  size_t shm_ring_bytes = 1 << 20;     // per direction and kind; power of two
  size_t small_bytes = 64 << 10;       // <= this: latency-optimal algorithms
  std::string device = "cpu";          // device backends: "cuda:N" ("cuda:0,cuda:1": nccl-legacy)
  std::string backend = "cpu";         // "cpu", "nccl", "nccl-lazy", "nccl-legacy"
  std::shared_ptr<CommDriver> comm_driver;  // device backends; null = NCCL (device builds)
  absl::Duration op_timeout = absl::Minutes(10);  // device backends: in-flight op deadline
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual absl::Status Connect() = 0;
  virtual absl::Status Run(const OpDesc& op) = 0;
  virtual void PostSend(const void* data, size_t bytes, int dst, int tag,
                        std::function<void(absl::Status)> done) = 0;
  virtual void PostRecv(void* data, size_t bytes, int src, int tag,
                        std::function<void(absl::Status)> done) = 0;
  virtual void Abort(const absl::Status& why) = 0;
  // One line describing the transports per peer, e.g. "shm x3" or "tcp x3".
  virtual std::string Describe() const = 0;

  // Device backends (the defaults suit the cpu backend):
  // An error the library reports asynchronously, or an in-flight op past its deadline; the group's
  // watchdog polls it and aborts the group on a non-OK status.
  virtual absl::Status AsyncError() { return absl::OkStatus(); }
  // The events of the op the last Run enqueued (null: the op is complete when Run returns).
  virtual std::shared_ptr<DeviceEvents> TakeOpEvents() { return nullptr; }
  // True when subgroups come from Split/Shrink below (the communicator library splits) instead
  // of a fresh bootstrap through the store.
  virtual bool SplitsInPlace() const { return false; }
  // Collective over this backend's ranks: color < 0 = not a member (FAILED_PRECONDITION, which
  // ProcessGroup turns into "no group"). `child` names the new group.
  virtual absl::StatusOr<std::unique_ptr<Backend>> Split(int color, int key, BackendOptions child) {
    return absl::UnimplementedError("split is not provided by this backend");
  }
  // Called by the survivors only: a backend over this one's ranks minus `excluded`.
  virtual absl::StatusOr<std::unique_ptr<Backend>> Shrink(const std::vector<int>& excluded,
                                                          BackendOptions child) {
    return absl::UnimplementedError("shrink is not provided by this backend");
  }
  // This rank and the group's size (split children learn them from the library); -1 = as created.
  virtual int GroupRank() const { return -1; }
  virtual int GroupSize() const { return -1; }
  // Bytes the communication library holds outside any allocator (reported in dumps/progress).
  virtual size_t MemoryBytes() const { return 0; }
};

// "cpu": shared memory between ranks with the same boot id, TCP otherwise. When every peer is on
// shared memory, collectives read peers' staged data in place (docs/comm.md).
std::unique_ptr<Backend> MakeCpuBackend(BackendOptions options);

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_BACKEND_H_
