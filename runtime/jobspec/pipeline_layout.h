// The pipeline layout a job spec asks for (parallelism.pipeline_*; docs/job-spec.md,
// docs/pipeline.md), with its defaults resolved, and the checks that refuse impossible layouts.
// Kept apart from spec.cc's generic YAML -> proto code. Thread-safe (pure functions).
//
//   const PipelineLayout pl = PipelineLayoutOf(spec);   // spec defaulted and validated
//   if (pl.enabled()) ... pl.ranks, pl.stages(), pl.schedule, pl.micro_batches ...
#ifndef EMBER_RUNTIME_JOBSPEC_PIPELINE_LAYOUT_H_
#define EMBER_RUNTIME_JOBSPEC_PIPELINE_LAYOUT_H_

#include <string>

#include "absl/status/status.h"
#include "proto/job_spec.pb.h"

namespace ember::spec {

struct PipelineLayout {
  int ranks = 1;             // parallelism.pipeline_stages: pipeline ranks (1 = no pipeline)
  int virtual_stages = 1;    // model chunks per rank (interleaved_1f1b; else 1)
  std::string schedule;      // "gpipe" | "1f1b" | "interleaved_1f1b" | "zbh1"
  int micro_batches = 1;     // pipeline micro-batches per optimizer step
  bool enabled() const { return ranks > 1; }
  int stages() const { return ranks * virtual_stages; }  // model stages (block groups)
};

// Defaults: schedule "" -> "1f1b", pipeline_micro_batches 0 -> pipeline_stages,
// pipeline_virtual_stages 0 -> 2 for interleaved_1f1b (1 otherwise).
PipelineLayout PipelineLayoutOf(const ::ember::spec::v1::JobSpec& spec);

// INVALID_ARGUMENT naming the field and the numbers for: counts out of range; an unknown
// schedule; strategy "pipeline" with fewer than 2 stages, or pipeline_stages > 1 with another
// strategy; model.n_layers not divisible by the model stages; fewer micro-batches than stages for
// 1f1b / zbh1; micro-batches not a multiple of the stages for interleaved_1f1b; virtual stages on
// a schedule other than interleaved_1f1b; world_size not a multiple of pipeline_stages (world =
// pipeline_stages x FSDP size: each stage is FSDP-sharded over world_size / pipeline_stages
// ranks); micro_batches (gradient accumulation) > 1 with a pipeline.
absl::Status ValidatePipelineLayout(const ::ember::spec::v1::JobSpec& spec);

}  // namespace ember::spec

#endif  // EMBER_RUNTIME_JOBSPEC_PIPELINE_LAYOUT_H_
