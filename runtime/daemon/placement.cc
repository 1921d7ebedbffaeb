#include "runtime/daemon/placement.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ember::daemon {
namespace {

// PlaceGang without the sort: nodes are used in the order given.
std::optional<jobs::v1::Assignment> PlaceInOrder(const GangRequest& request,
                                                 const std::vector<NodeCapacity>& nodes) {
  if (request.world_size <= 0) return std::nullopt;
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

std::string Devices(int n, const std::string& kind) {
  return absl::StrCat(n, " ", kind, n == 1 ? " device" : " devices");
}

// "8 cuda devices", "4 cpu devices (2 per node)", "4 cpu devices on 2 nodes".
std::string Need(const GangRequest& r, const std::string& kind) {
  std::string s = Devices(r.world_size, kind);
  if (r.devices_per_node > 0) absl::StrAppend(&s, " (", r.devices_per_node, " per node)");
  else if (r.nodes > 0) absl::StrAppend(&s, " on ", r.nodes, r.nodes == 1 ? " node" : " nodes");
  return s;
}

}  // namespace

bool DeviceOfKind(const std::string& id, const std::string& kind) {
  return id.size() > kind.size() && id.compare(0, kind.size(), kind) == 0 && id[kind.size()] == ':';
}

std::optional<jobs::v1::Assignment> PlaceGang(const GangRequest& request,
                                              std::vector<NodeCapacity> nodes) {
  std::stable_sort(nodes.begin(), nodes.end(), [](const NodeCapacity& a, const NodeCapacity& b) {
    if (a.free.size() != b.free.size()) return a.free.size() > b.free.size();
    return a.name < b.name;
  });
  return PlaceInOrder(request, nodes);
}

absl::Status CheckEverPlaceable(const GangRequest& request, const std::string& kind,
                                const std::vector<NodeDevices>& nodes) {
  std::vector<NodeCapacity> all;
  std::vector<std::string> per_node;
  int total = 0, widest = 0;
  for (const NodeDevices& n : nodes) {
    NodeCapacity c{n.name, n.address, {}};
    for (const std::string& d : n.devices)
      if (DeviceOfKind(d, kind)) c.free.push_back(d);
    if (c.free.empty()) continue;
    total += c.free.size();
    widest = std::max<int>(widest, c.free.size());
    per_node.push_back(absl::StrCat(n.name, " ", c.free.size()));
    all.push_back(std::move(c));
  }
  if (PlaceGang(request, all)) return absl::OkStatus();
  const std::string what =
      absl::StrCat("a gang of ", Need(request, kind), " can never be placed: ");
  if (total == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "no registered node has ", kind, " devices (", nodes.size(),
        " node(s) registered); submit with device_type and backend for the devices the "
        "cluster has"));
  }
  // The largest gang of this shape the cluster could hold.
  std::string largest;
  if (request.devices_per_node > 0 || request.nodes > 0) {
    const int per = request.devices_per_node > 0 ? request.devices_per_node : 0;
    int fit_nodes = 0;
    for (const NodeCapacity& c : all) fit_nodes += per > 0 && int(c.free.size()) >= per ? 1 : 0;
    if (per > 0 && request.devices_per_node > widest) {
      largest = absl::StrCat("at most ", widest, " per node");
    } else if (per > 0) {
      largest = absl::StrCat("at most ", fit_nodes * per, " ranks at ", per, " per node");
    } else {
      largest = absl::StrCat("at most ", std::min<int>(request.nodes, all.size()), " nodes of ",
                             widest, " ", kind, " devices");
    }
  } else {
    largest = absl::StrCat("at most ", total, total == 1 ? " rank" : " ranks");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, "the registered nodes have ", Devices(total, kind), " in all (",
      absl::StrJoin(per_node, ", "), "); ", largest));
}

std::vector<QueueDecision> PlanQueue(const std::vector<QueuedJob>& fifo,
                                     std::vector<NodeDevices> nodes) {
  std::vector<QueueDecision> out;
  std::set<std::string> reserved;             // "node/device" reserved by an earlier job
  std::map<std::string, std::string> holder;  // "node/device" -> the job that reserved it
  auto key = [](const NodeDevices& n, const std::string& d) { return n.name + "/" + d; };
  for (const QueuedJob& job : fifo) {
    QueueDecision dec;
    dec.id = job.id;
    // Free now and not reserved, per node.
    std::vector<NodeCapacity> usable;
    int free_total = 0, free_reserved = 0;
    std::set<std::string> blockers;
    for (const NodeDevices& n : nodes) {
      if (n.draining) continue;
      NodeCapacity c{n.name, n.address, {}};
      for (const std::string& d : n.devices) {
        if (!DeviceOfKind(d, job.kind) || n.busy.count(d)) continue;
        ++free_total;
        if (reserved.count(key(n, d))) {
          ++free_reserved;
          blockers.insert(holder[key(n, d)]);
          continue;
        }
        c.free.push_back(d);
      }
      usable.push_back(std::move(c));
    }
    if (job.startable) dec.placement = PlaceGang(job.request, usable);
    if (dec.placement) {
      for (const auto& na : dec.placement->nodes()) {
        for (NodeDevices& n : nodes) {
          if (n.name == na.node()) n.busy.insert(na.devices().begin(), na.devices().end());
        }
      }
      out.push_back(std::move(dec));
      continue;
    }
    // Reserve where it will start: busy devices first (they free as running jobs end), then
    // the fewest free ones; nodes with the most busy usable devices first, ties by name.
    std::vector<std::pair<int, NodeCapacity>> order;
    for (const NodeDevices& n : nodes) {
      if (n.draining) continue;
      NodeCapacity c{n.name, n.address, {}};
      std::vector<std::string> free_here;
      for (const std::string& d : n.devices) {
        if (!DeviceOfKind(d, job.kind) || reserved.count(key(n, d))) continue;
        (n.busy.count(d) ? c.free : free_here).push_back(d);
      }
      const int busy_here = c.free.size();
      c.free.insert(c.free.end(), free_here.begin(), free_here.end());
      order.push_back({busy_here, std::move(c)});
    }
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second.name < b.second.name;
    });
    std::vector<NodeCapacity> in_order;
    for (auto& [b, c] : order) in_order.push_back(std::move(c));
    // A job that could not start even after every running job ends (draining or missing nodes)
    // reserves nothing: holding devices for it would stall the queue behind it.
    if (auto r = PlaceInOrder(job.request, in_order)) {
      for (const auto& na : r->nodes()) {
        for (const std::string& d : na.devices()) {
          reserved.insert(na.node() + "/" + d);
          holder[na.node() + "/" + d] = job.id;
        }
      }
    }
    if (!job.startable) {
      dec.waiting = job.not_startable_reason;
    } else if (free_reserved > 0 && free_total >= job.request.world_size) {
      std::vector<std::string> names(blockers.begin(), blockers.end());
      dec.waiting = absl::StrCat("waiting: needs ", Need(job.request, job.kind), ", ", free_total,
                                 " free but ", free_reserved, " of them reserved for earlier job",
                                 names.size() == 1 ? " " : "s ", absl::StrJoin(names, ", "));
    } else {
      dec.waiting = absl::StrCat("waiting: needs ", Need(job.request, job.kind), ", ", free_total,
                                 " free");
    }
    out.push_back(std::move(dec));
  }
  return out;
}

}  // namespace ember::daemon
