// Gang placement: all of a job's ranks or none. Pure function over a snapshot of free devices, so
// the scheduler's decisions are unit-testable. Thread-safe.
#ifndef EMBER_RUNTIME_DAEMON_PLACEMENT_H_
#define EMBER_RUNTIME_DAEMON_PLACEMENT_H_

#include <optional>
#include <string>
#include <vector>

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

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_PLACEMENT_H_
