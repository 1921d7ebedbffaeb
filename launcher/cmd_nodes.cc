// emberctl nodes: the registered daemons, their devices (and which job holds each), telemetry.
#include <iostream>

#include "absl/strings/str_format.h"
#include "launcher/cli.h"

namespace ember::cli {

int RunNodes(Ctl& ctl) {
  auto c = ctl.Connect();
  if (!c.ok()) return ctl.Fail(c.status());
  auto nodes = c->Nodes();
  if (!nodes.ok()) return ctl.Fail(nodes.status());
  if (ctl.json()) {
    jobs::v1::ListNodesResponse r;
    for (auto& n : *nodes) *r.add_nodes() = n;
    std::cout << Ctl::ToJson(r) << "\n";
    return kOk;
  }
  constexpr double kGiB = 1073741824.0;
  for (const auto& n : *nodes) {
    std::cout << absl::StrFormat("%-20s %-22s %s  %d workers  mem %.1f/%.1f GiB free\n", n.name(),
                                 n.address(),
                                 n.draining() ? "draining" : n.healthy() ? "healthy" : "stale",
                                 n.workers(), n.memory_available_bytes() / kGiB,
                                 n.memory_total_bytes() / kGiB);
    for (const auto& d : n.devices()) {
      std::cout << "  " << absl::StrFormat("%-8s", d.id())
                << (d.job_id().empty() ? "free" : d.job_id());
      if (d.has_gpu()) {
        const auto& g = d.gpu();
        std::cout << absl::StrFormat("  %s %.1f/%.1f GiB %d%% %.0f W %d MHz %d C", g.name(),
                                     g.memory_used_bytes() / kGiB, g.memory_total_bytes() / kGiB,
                                     g.utilization_pct(), g.power_mw() / 1000.0, g.sm_clock_mhz(),
                                     g.temperature_c());
      }
      std::cout << "\n";
    }
  }
  return kOk;
}

}  // namespace ember::cli
