// Placement and queue planning as pure decisions over cluster snapshots (no daemon, no store).
#include "runtime/daemon/placement.h"

#include "absl/strings/match.h"
#include "catch2/catch.hpp"

namespace ember::daemon {
namespace {

NodeDevices Node(const std::string& name, std::vector<std::string> devices,
                 std::set<std::string> busy = {}) {
  return NodeDevices{name, name + ":1", false, std::move(devices), std::move(busy)};
}

QueuedJob Job(const std::string& id, int world, const std::string& kind = "cpu") {
  QueuedJob j;
  j.id = id;
  j.kind = kind;
  j.request.world_size = world;
  return j;
}

std::vector<std::string> DevicesOn(const jobs::v1::Assignment& a, const std::string& node) {
  for (const auto& na : a.nodes())
    if (na.node() == node) return {na.devices().begin(), na.devices().end()};
  return {};
}

TEST_CASE("never placeable: names the largest gang the registered nodes could hold") {
  std::vector<NodeDevices> nodes = {Node("node-a", {"cpu:0", "cpu:1"}),
                                    Node("node-b", {"cpu:0", "cpu:1"}, {"cpu:0"})};
  REQUIRE(CheckEverPlaceable({4}, "cpu", nodes).ok());  // busy devices count: they free
  absl::Status s = CheckEverPlaceable({65536}, "cpu", nodes);
  REQUIRE(absl::IsFailedPrecondition(s));
  INFO(s.message());
  REQUIRE(absl::StrContains(s.message(), "65536 cpu devices can never be placed"));
  REQUIRE(absl::StrContains(s.message(), "4 cpu devices in all (node-a 2, node-b 2)"));
  REQUIRE(absl::StrContains(s.message(), "at most 4 ranks"));

  s = CheckEverPlaceable({1}, "cuda", nodes);
  INFO(s.message());
  REQUIRE(absl::IsFailedPrecondition(s));
  REQUIRE(absl::StrContains(s.message(), "no registered node has cuda devices"));

  s = CheckEverPlaceable({3, 0, 3}, "cpu", nodes);  // 3 per node: no node has 3
  INFO(s.message());
  REQUIRE(absl::StrContains(s.message(), "at most 2 per node"));
  s = CheckEverPlaceable({6, 0, 2}, "cpu", nodes);  // 3 nodes of 2: there are 2
  INFO(s.message());
  REQUIRE(absl::StrContains(s.message(), "at most 4 ranks at 2 per node"));
  // A draining node still counts: it comes back.
  nodes[1].draining = true;
  REQUIRE(CheckEverPlaceable({4}, "cpu", nodes).ok());
}

TEST_CASE("a head that does not fit gives its reason and keeps strict order for its devices") {
  // node-a fully busy (a running 2-rank job), node-b free: a 3-rank head cannot start.
  std::vector<NodeDevices> nodes = {Node("node-a", {"cpu:0", "cpu:1"}, {"cpu:0", "cpu:1"}),
                                    Node("node-b", {"cpu:0", "cpu:1"})};
  auto d = PlanQueue({Job("head", 3), Job("small", 1), Job("pair", 2), Job("one-more", 1)}, nodes);
  REQUIRE(d.size() == 4);
  REQUIRE_FALSE(d[0].placement);
  REQUIRE(d[0].waiting == "waiting: needs 3 cpu devices, 2 free");
  // The head reserves node-a's two busy devices and one free device of node-b; the other free
  // device is backfilled by the 1-rank job, which so cannot delay the head.
  REQUIRE(d[1].placement);
  REQUIRE(DevicesOn(*d[1].placement, "node-b") == std::vector<std::string>{"cpu:1"});
  REQUIRE_FALSE(d[2].placement);
  INFO(d[2].waiting);
  REQUIRE(d[2].waiting == "waiting: needs 2 cpu devices, 1 free");
  REQUIRE_FALSE(d[3].placement);
  REQUIRE(d[3].waiting ==
          "waiting: needs 1 cpu device, 1 free but 1 of them reserved for earlier job head");
}

TEST_CASE("strict FIFO when the head would use every device; other kinds never compete") {
  std::vector<NodeDevices> nodes = {
      Node("gpu-1", {"cuda:0", "cuda:1", "cuda:2", "cuda:3", "cpu:0", "cpu:1"},
           {"cuda:0", "cuda:1", "cuda:2", "cuda:3"}),
      Node("gpu-2", {"cuda:0", "cuda:1", "cuda:2", "cuda:3"})};
  auto d = PlanQueue({Job("big", 8, "cuda"), Job("gpu-small", 1, "cuda"), Job("cpu", 2)}, nodes);
  REQUIRE_FALSE(d[0].placement);
  REQUIRE(d[0].waiting == "waiting: needs 8 cuda devices, 4 free");
  REQUIRE_FALSE(d[1].placement);  // every cuda device is the head's
  REQUIRE(absl::StrContains(d[1].waiting, "reserved for earlier job big"));
  REQUIRE(d[2].placement);  // cpu devices: the head cannot use them
}

TEST_CASE("jobs that fit are placed in order and take their devices") {
  std::vector<NodeDevices> nodes = {Node("node-a", {"cpu:0", "cpu:1"}),
                                    Node("node-b", {"cpu:0", "cpu:1"})};
  auto d = PlanQueue({Job("j1", 2), Job("j2", 2), Job("j3", 1)}, nodes);
  REQUIRE(d[0].placement);
  REQUIRE(d[1].placement);
  REQUIRE(d[0].placement->nodes(0).node() != d[1].placement->nodes(0).node());
  REQUIRE_FALSE(d[2].placement);
  REQUIRE(d[2].waiting == "waiting: needs 1 cpu device, 0 free");
}

TEST_CASE("a job that may not start yet keeps its reservation and its own reason") {
  std::vector<NodeDevices> nodes = {Node("node-a", {"cpu:0", "cpu:1"})};
  QueuedJob backing_off = Job("restarting", 2);
  backing_off.startable = false;
  auto d = PlanQueue({backing_off, Job("later", 1)}, nodes);
  REQUIRE_FALSE(d[0].placement);
  REQUIRE(d[0].waiting.empty());  // keeps the reason it has (the restart's)
  REQUIRE_FALSE(d[1].placement);  // cannot take a device the restart will use
  // A draining node offers nothing; a job that cannot start even when every job ends reserves
  // nothing, so it does not stall the queue behind it.
  nodes.push_back(Node("node-b", {"cpu:0", "cpu:1"}));
  nodes[0].draining = true;
  d = PlanQueue({Job("needs-4", 4), Job("fits", 2)}, nodes);
  REQUIRE_FALSE(d[0].placement);
  REQUIRE(d[1].placement);
  REQUIRE(d[1].placement->nodes(0).node() == "node-b");
}

}  // namespace
}  // namespace ember::daemon
