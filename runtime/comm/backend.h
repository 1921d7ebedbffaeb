// Backend: what a transport/algorithm implementation ("cpu" now; "nccl", "nccl-lazy",
// "nccl-legacy" later) provides to ProcessGroup. ProcessGroup owns ordering, sequence numbers,
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

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/comm/types.h"

namespace ember::comm {

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
  std::string device = "cpu";
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
};

// "cpu": shared memory between ranks with the same boot id, TCP otherwise. When every peer is on
// shared memory, collectives read peers' staged data in place (docs/comm.md).
std::unique_ptr<Backend> MakeCpuBackend(BackendOptions options);

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_BACKEND_H_
