// A worker's model state <-> files: resume from a checkpoint (any world size), initialise from
// safetensors weights, and snapshot the state a checkpoint saves; for FSDP and pipeline runs. Used by the training loop
// (trainer.cc); formats in docs/checkpoint-format.md.
//
// Thread safety: call from the training thread (they read or write the model's shards).
#ifndef EMBER_RUNTIME_WORKER_MODEL_STATE_H_
#define EMBER_RUNTIME_WORKER_MODEL_STATE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.h"
#include "runtime/data/token_file.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/pipeline/stage.h"

namespace ember::worker {

// The checkpoint parallelism key of a pipeline run ("pipeline" -> its layout string).
inline constexpr char kPipelineKey[] = "pipeline";

// Copies this rank's rows of every parameter and its AdamW state from the checkpoint in step
// directory `dir` (any world size: ReadShard asks for our torch.chunk rows), and the data loader's
// position. Returns the checkpoint's step.
// FAILED_PRECONDITION for a checkpoint a pipeline run saved (its data-loader state is the
// pipeline's single stream, not this rank's).
absl::StatusOr<int64_t> Restore(const std::string& dir, fsdp::FsdpGpt& m, data::TokenLoader& loader);

// Pipeline runs (pipeline::PipelineGpt): every parameter is saved whole, once (the tied wte by
// stage 0's rank), with its AdamW state, the data loader's position and parallelism
// {"pipeline": layout}, where `layout` names stages, schedule and micro-batches. Resume reads only
// a checkpoint whose layout string equals ours: FAILED_PRECONDITION naming both layouts
// otherwise (resuming across layouts is not built).
ckpt::RankState SnapshotPipeline(pipeline::PipelineGpt& m, const data::TokenLoader& loader,
                                 int64_t step, uint64_t seed, const std::string& layout);
absl::StatusOr<int64_t> RestorePipeline(const std::string& dir, pipeline::PipelineGpt& m,
                                        data::TokenLoader& loader, const std::string& layout);

// Initialises this rank's parameter shards from safetensors weights named like the model's
// parameters (a single file or a model.safetensors.index.json set; F32, BF16 or F16). Optimizer
// state starts at zero. Every model parameter must be present with the model's shape.
absl::Status InitFromSafetensors(const std::string& path, fsdp::FsdpGpt& m);

// What a checkpoint of step `step` saves for this rank; views into `m`'s shards (valid until the
// next optimizer step).
ckpt::RankState Snapshot(fsdp::FsdpGpt& m, const data::TokenLoader& loader, int64_t step, uint64_t seed);

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_MODEL_STATE_H_
