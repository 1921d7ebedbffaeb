// pipeline_show: prints a schedule's per-rank action table and its simulated makespan, bubble and
// receive-buffer depth (the text `emberctl pipeline show` is meant to print; docs/pipeline.md).
//
//   bazel run //runtime/pipeline:pipeline_show -- --schedule=1f1b --stages=4 --micro-batches=8
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/flags.h"
#include "runtime/pipeline/simulator.h"

ABSL_FLAG(std::string, schedule, "1f1b", "gpipe, 1f1b, interleaved-1f1b or zbh1");
ABSL_FLAG(int, stages, 4, "pipeline stages");
ABSL_FLAG(int, ranks, 0, "ranks (0: stages, or stages/2 for interleaved-1f1b)");
ABSL_FLAG(int, micro_batches, 8, "micro-batches per step");
ABSL_FLAG(bool, rendezvous, false, "simulate sends that block until received (default: eager)");

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "pipeline_show");
  using namespace ember::pipeline;
  auto kind = ParseScheduleKind(absl::GetFlag(FLAGS_schedule));
  if (!kind.ok()) {
    std::fprintf(stderr, "%s\n", std::string(kind.status().message()).c_str());
    return 2;
  }
  ScheduleOptions o;
  o.kind = *kind;
  o.stages = absl::GetFlag(FLAGS_stages);
  o.ranks = absl::GetFlag(FLAGS_ranks);
  if (o.ranks == 0) o.ranks = o.kind == ScheduleKind::kInterleaved1F1B ? o.stages / 2 : o.stages;
  o.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  auto s = BuildSchedule(o);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
    return 2;
  }
  std::fputs(FormatSchedule(*s).c_str(), stdout);
  SimOptions so;
  const bool rv = absl::GetFlag(FLAGS_rendezvous);
  so.send_mode = rv ? SendMode::kRendezvous : SendMode::kEager;
  auto sim = Simulate(*s, so);
  if (!sim.ok()) {
    std::fprintf(stderr, "%s\n", std::string(sim.status().message()).c_str());
    return 1;
  }
  std::printf("simulated (F=1, B=2, I=W=1, %s sends): makespan %lld, bubble %.4f, peak receive "
              "buffers per rank [%s]\n",
              rv ? "rendezvous" : "eager", static_cast<long long>(sim->makespan), sim->bubble_fraction,
              absl::StrJoin(sim->peak_recv_buffers, ", ").c_str());
  return 0;
}
