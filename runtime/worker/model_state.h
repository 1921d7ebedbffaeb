// A worker's model state <-> files: resume from a checkpoint (any world size), initialise from
// safetensors weights, and snapshot the state a checkpoint saves; for every layout (TrainState). Used by the training loop
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
#include "runtime/worker/train_state.h"

namespace ember::worker {

// Copies this rank's rows of every parameter and its AdamW state (every copy: a pipeline's second
// wte too) from the checkpoint in step directory `dir`, saved at any layout (FSDP world size, HSDP,
// pipeline stages: checkpoints keep global names and full shapes), and the data loader's position
// (sequences consumed, the same at any layout). Returns the checkpoint's step. NOT_FOUND /
// FAILED_PRECONDITION for a missing tensor or another shape.
absl::StatusOr<int64_t> Restore(const std::string& dir, TrainState& m, data::TokenLoader& loader);

// Initialises this rank's parameter shards from safetensors weights named like the model's
// parameters (a single file or a model.safetensors.index.json set; F32, BF16 or F16). Optimizer
// state starts at zero. Every model parameter must be present with the model's shape.
absl::Status InitFromSafetensors(const std::string& path, TrainState& m);

// The Hugging Face LlamaForCausalLM config of a llama model (max_position_embeddings = context).
ckpt::HfLlamaConfig HfConfigFor(const model::GptConfig& c);
// The same for a job spec's model (`emberctl ckpt export --format hf --spec`); FAILED_PRECONDITION
// unless it is model.arch llama with the SwiGLU MLP.
absl::StatusOr<ckpt::HfLlamaConfig> HfConfigForSpec(const spec::JobSpec& s);

// Adds the model's records to a checkpoint's extra: model.arch (the spec's name: gpt, llama or a
// registered architecture) and, for llama,
// hf.config (config.json text), which `emberctl ckpt export --format hf` reads.
void RecordModel(const std::string& arch, const model::GptConfig& c, ckpt::RankState* st);

// checkpoint.init_from: initialises this rank's parameter shards from a Hugging Face Llama
// directory (config.json checked against the model: a mismatch names the field and both values;
// tensors checked by ckpt::HfCheckpoint::Open), un-permuting q/k rows. Optimizer state starts at
// zero. FAILED_PRECONDITION for a gpt-arch model.
absl::Status InitFromHf(const std::string& dir, TrainState& m);

// What a checkpoint of step `step` saves for this rank: its primary shards (views valid until the
// next optimizer step), the loader position, the optimizer step and the layout record.
ckpt::RankState Snapshot(TrainState& m, const data::TokenLoader& loader, int64_t step, uint64_t seed);

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_MODEL_STATE_H_
