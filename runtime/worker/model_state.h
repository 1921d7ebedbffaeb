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
#include "checkpoint/hf_config.h"
#include "runtime/data/token_file.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/jobspec/spec.h"
#include "runtime/pipeline/stage.h"

namespace ember::worker {

// The checkpoint parallelism key of a pipeline run ("pipeline" -> its layout string).
inline constexpr char kPipelineKey[] = "pipeline";

// Copies this rank's rows of every parameter and its AdamW state from the checkpoint in step
// directory `dir` (any world size: ReadShard asks for our torch.chunk rows), and the data loader's
// position (sequences consumed, the same at any layout). Returns the checkpoint's step. A
// pipeline run's checkpoint is read the same way (it saves global names and full shapes).
absl::StatusOr<int64_t> Restore(const std::string& dir, fsdp::FsdpGpt& m, data::TokenLoader& loader);

// Pipeline runs (pipeline::PipelineGpt): each parameter is saved once under its global name and
// full shape, as the rows this rank updates (row_begin = its torch.chunk offset in the stage
// group when sharded; the tied wte by stage 0's ranks only), with the AdamW state of those rows,
// the data loader's position and parallelism {"pipeline": layout} (stages, schedule,
// micro-batches, FSDP size; informational). Resume reads any checkpoint of the same model, from
// any pipeline layout or FSDP world size: the whole parameter, and the AdamW state of this rank's
// rows. NOT_FOUND / FAILED_PRECONDITION for a missing tensor or another shape.
ckpt::RankState SnapshotPipeline(pipeline::PipelineGpt& m, const data::TokenLoader& loader,
                                 int64_t step, uint64_t seed, const std::string& layout);
absl::StatusOr<int64_t> RestorePipeline(const std::string& dir, pipeline::PipelineGpt& m,
                                        data::TokenLoader& loader, const std::string& layout);

// Initialises this rank's parameter shards from safetensors weights named like the model's
// parameters (a single file or a model.safetensors.index.json set; F32, BF16 or F16). Optimizer
// state starts at zero. Every model parameter must be present with the model's shape.
absl::Status InitFromSafetensors(const std::string& path, fsdp::FsdpGpt& m);

// The Hugging Face LlamaForCausalLM config of a llama model (max_position_embeddings = context).
ckpt::HfLlamaConfig HfConfigFor(const model::GptConfig& c);
// The same for a job spec's model (`emberctl ckpt export --format hf --spec`); FAILED_PRECONDITION
// unless it is model.arch llama with the SwiGLU MLP.
absl::StatusOr<ckpt::HfLlamaConfig> HfConfigForSpec(const spec::JobSpec& s);

// Adds the model's records to a checkpoint's extra: model.arch ("gpt" | "llama") and, for llama,
// hf.config (config.json text), which `emberctl ckpt export --format hf` reads.
void RecordModel(const model::GptConfig& c, ckpt::RankState* st);

// checkpoint.init_from: initialises this rank's parameter shards from a Hugging Face Llama
// directory (config.json checked against the model: a mismatch names the field and both values;
// tensors checked by ckpt::HfCheckpoint::Open), un-permuting q/k rows. Optimizer state starts at
// zero. FAILED_PRECONDITION for a gpt-arch model.
absl::Status InitFromHf(const std::string& dir, fsdp::FsdpGpt& m);

// What a checkpoint of step `step` saves for this rank; views into `m`'s shards (valid until the
// next optimizer step).
ckpt::RankState Snapshot(fsdp::FsdpGpt& m, const data::TokenLoader& loader, int64_t step, uint64_t seed);

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_MODEL_STATE_H_
