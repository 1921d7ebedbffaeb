// emberctl pipeline show: a pipeline schedule's per-rank action table (runtime/pipeline), with its
// simulated makespan, bubble and receive-buffer depth. Runs locally; needs no daemon.
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "launcher/cli.h"
#include "runtime/pipeline/simulator.h"

namespace ember::cli {

int RunPipelineShow(Ctl& ctl) {
  using namespace ember::pipeline;
  auto kind = ParseScheduleKind(ctl.args().Get("--schedule", "1f1b"));
  if (!kind.ok()) return ctl.UsageError(std::string(kind.status().message()));
  ScheduleOptions o;
  o.kind = *kind;
  o.stages = 4;
  o.micro_batches = 8;
  o.ranks = 0;
  if (!ctl.IntOption("--stages", 1, &o.stages) || !ctl.IntOption("--micro-batches", 1, &o.micro_batches) ||
      !ctl.IntOption("--ranks", 1, &o.ranks)) {
    return kUsage;
  }
  if (o.ranks == 0) o.ranks = o.kind == ScheduleKind::kInterleaved1F1B ? std::max(1, o.stages / 2) : o.stages;
  auto s = BuildSchedule(o);
  if (!s.ok()) return ctl.Fail(s.status());  // INVALID_ARGUMENT naming the numbers: exit 2
  SimOptions so;
  const bool rv = ctl.args().Has("--rendezvous");
  so.send_mode = rv ? SendMode::kRendezvous : SendMode::kEager;
  auto sim = Simulate(*s, so);
  if (!sim.ok()) return ctl.Fail(sim.status());
  if (ctl.json()) {
    std::cout << absl::StrFormat(
        "{\"schedule\": %s, \"stages\": %d, \"ranks\": %d, \"micro_batches\": %d, \"makespan\": %d, "
        "\"bubble_fraction\": %.6f, \"peak_recv_buffers\": [%s], \"table\": %s}\n",
        Ctl::Quote(ctl.args().Get("--schedule", "1f1b")), o.stages, o.ranks, o.micro_batches,
        static_cast<long long>(sim->makespan), sim->bubble_fraction,
        absl::StrJoin(sim->peak_recv_buffers, ", "), Ctl::Quote(FormatSchedule(*s)));
    return kOk;
  }
  std::cout << FormatSchedule(*s);
  std::cout << absl::StrFormat(
      "simulated (F=1, B=2, I=W=1, %s sends): makespan %d, bubble %.4f, peak receive buffers per "
      "rank [%s]\n",
      rv ? "rendezvous" : "eager", static_cast<long long>(sim->makespan), sim->bubble_fraction,
      absl::StrJoin(sim->peak_recv_buffers, ", "));
  return kOk;
}

}  // namespace ember::cli
