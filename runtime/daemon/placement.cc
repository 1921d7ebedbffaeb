#include "runtime/daemon/placement.h"

#include <algorithm>

namespace ember::daemon {

std::optional<jobs::v1::Assignment> PlaceGang(const GangRequest& request,
                                              std::vector<NodeCapacity> nodes) {
  if (request.world_size <= 0) return std::nullopt;
  std::stable_sort(nodes.begin(), nodes.end(), [](const NodeCapacity& a, const NodeCapacity& b) {
    if (a.free.size() != b.free.size()) return a.free.size() > b.free.size();
    return a.name < b.name;
  });
  int per_node = request.devices_per_node;
  if (per_node == 0 && request.nodes > 0) {
    if (request.world_size % request.nodes != 0) return std::nullopt;
    per_node = request.world_size / request.nodes;
  }
  if (per_node > 0 && request.world_size % per_node != 0) return std::nullopt;
  int want_nodes = per_node > 0 ? request.world_size / per_node : 0;
  if (request.nodes > 0 && want_nodes > 0 && want_nodes != request.nodes) return std::nullopt;

  jobs::v1::Assignment out;
  out.set_world_size(request.world_size);
  int rank = 0;
  for (const NodeCapacity& n : nodes) {
    if (rank == request.world_size) break;
    int take = per_node > 0 ? per_node
                            : std::min<int>(n.free.size(), request.world_size - rank);
    if (take == 0 || static_cast<int>(n.free.size()) < take) continue;
    jobs::v1::NodeAssignment* a = out.add_nodes();
    a->set_node(n.name);
    a->set_daemon_address(n.address);
    a->set_first_rank(rank);
    a->set_node_rank(out.nodes_size() - 1);
    for (int i = 0; i < take; ++i) a->add_devices(n.free[i]);
    rank += take;
  }
  if (rank != request.world_size) return std::nullopt;
  return out;
}

}  // namespace ember::daemon
