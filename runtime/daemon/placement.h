// Gang placement and queue planning: all of a job's ranks or none. Pure functions over a snapshot
// of the cluster's devices, so every scheduling decision is unit-testable without a daemon.
// Thread-safe (no state).
//
//   std::vector<NodeDevices> nodes = ...;          // from the store: devices and who holds them
//   for (const QueueDecision& d : PlanQueue(fifo, nodes)) {
//     if (d.placement) ... claim and start ...    // else d.waiting is the job's reason
//   }
#ifndef EMBER_RUNTIME_DAEMON_PLACEMENT_H_
#define EMBER_RUNTIME_DAEMON_PLACEMENT_H_

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/jobs.pb.h"

namespace ember::daemon {

struct NodeCapacity {
  std::string name;
  std::string address;
  std::vector<std::string> free;  // free device ids of the requested kind, in preferred order
};

struct GangRequest {
  int world_size = 1;
  int nodes = 0;             // exactly this many nodes; 0 = as few as possible
  int devices_per_node = 0;  // ranks per node; 0 = any split
};

// Returns an assignment using as few nodes as possible (the fullest first; ties by name, so the
// result is deterministic), or nullopt when the gang does not fit now. Ranks are contiguous per node.
std::optional<jobs::v1::Assignment> PlaceGang(const GangRequest& request,
                                              std::vector<NodeCapacity> nodes);

// True when device id `id` ("cuda:1") is of `kind` ("cuda").
bool DeviceOfKind(const std::string& id, const std::string& kind);

// One registered node as the scheduler sees it.
struct NodeDevices {
  std::string name;
  std::string address;
  bool draining = false;             // takes no new placements
  std::vector<std::string> devices;  // every device id ("cpu:0", "cuda:1"), placement order
  std::set<std::string> busy;        // the ids held by a job now
};

// OK when some set of the registered `nodes` (draining or not: they come back) could ever hold the
// gang, i.e. with every device free. Else FAILED_PRECONDITION naming the largest gang of that kind
// and shape the cluster can hold, e.g. "world_size 65536 can never be placed: the registered nodes
// have 4 cpu devices in all (node-a 2, node-b 2); at most 4 ranks".
absl::Status CheckEverPlaceable(const GangRequest& request, const std::string& kind,
                                const std::vector<NodeDevices>& nodes);

// A job in the scheduler's queue, in FIFO order (submit time).
struct QueuedJob {
  std::string id;
  std::string kind;  // device kind: "cpu" | "cuda"
  GangRequest request;
  // False while the job may not start yet though it keeps its place (restart backoff, or its
  // previous attempt still holds devices): it is treated like a job that does not fit.
  bool startable = true;
  std::string not_startable_reason;  // the waiting reason then ("" = keep the job's own)
};

struct QueueDecision {
  std::string id;
  std::optional<jobs::v1::Assignment> placement;  // start now here
  std::string waiting;  // when not placed: "waiting: needs 8 cuda devices, 4 free"
};

// Plans one scheduling pass: FIFO with conservative backfill. Jobs are taken in order; each one
// that fits the free devices not reserved by an earlier job is placed (and its devices become
// busy). A job that does not fit reserves the devices it will start on: the busy devices it can
// use first (they free when running jobs end), then as few free ones as it needs, never a device
// an earlier job reserved. Later jobs may use only free devices outside every reservation, so a
// backfilled job never holds a device an earlier job waits for: it cannot delay that job's start
// (given the running jobs, whose run times ember does not know, end when they end). Jobs of
// another device kind never compete. Returns one decision per job, in order.
std::vector<QueueDecision> PlanQueue(const std::vector<QueuedJob>& fifo,
                                     std::vector<NodeDevices> nodes);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_PLACEMENT_H_
