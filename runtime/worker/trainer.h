// The training program of ember-worker: turn (environment, job spec) into a validated Plan, then
// run it: rendezvous, process groups, FSDP model, data, the step loop with logging and progress,
// periodic checkpoints, and resumption from `latest` (at any world size). A job with
// parallelism.pipeline_stages > 1 runs world / stages pipeline replicas instead
// (pipeline::PipelineGpt, each stage FSDP-sharded over its stage group; checkpoints resume across
// pipeline layouts and FSDP world sizes; docs/pipeline.md). The environment and the
// store keys it reads and writes are the job contract (runtime/job).
//
// Exit-code contract (worker_main.cc): Prepare errors are bad spec/environment (exit 2, message
// names the field or variable); Train errors are runtime failures (exit 1).
//
// Thread safety: call from one thread.
//
//   ASSIGN_OR_RETURN(Plan plan, Prepare(env, spec_path));
//   RETURN_IF_ERROR(Train(plan));
#ifndef EMBER_RUNTIME_WORKER_TRAINER_H_
#define EMBER_RUNTIME_WORKER_TRAINER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/data/token_file.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/jobspec/parallel_dims.h"
#include "runtime/jobspec/spec.h"
#include "runtime/model/model.h"
#include "runtime/job/env.h"
#include "runtime/store/client.h"

namespace ember::worker {

struct Plan {
  job::WorkerEnv env;
  spec::JobSpec spec;
  model::GptConfig model;
  fsdp::FsdpOptions fsdp;
  std::shared_ptr<data::TokenFile> tokens;
  std::string checkpoint_root;  // <job_dir>/<checkpoint.dir or "checkpoints">
  std::string metrics_path;     // <job_dir>/metrics/rank-<r>.jsonl
  std::string init_safetensors; // checkpoint.init_from_safetensors resolved, or "" (fresh init)
  std::string init_hf;          // checkpoint.init_from (a Hugging Face Llama directory) resolved, or ""
  int threads = 1;
  bool separate_reduce_scatter = true;
  int dp_replicate = 1;  // HSDP replicas (parallelism.dp_replicate); 1: plain FSDP
  // The rank arithmetic of this job (pp x dp_replicate x dp_shard): groups, data shard, stages.
  std::optional<spec::ParallelDims> dims;
  // The model, built through the architecture registry from model.arch (runtime/model/registry.h).
  std::shared_ptr<const model::Model> arch;
};

// Loads the spec (`spec_path`, else env.job_spec, else <job_dir>/job.yaml): the daemon's resolved
// spec as written, or one without the resolved marker resolved once here for env.world_size
// (spec::LoadWorkerSpec). Then checks what only a rank can: its world against the resolved one,
// device, the data file and its token range. INVALID_ARGUMENT / NOT_FOUND name the field, variable or path.
absl::StatusOr<Plan> Prepare(const job::WorkerEnv& env, const std::string& spec_path);

// The optimizer settings of a resolved spec (its model: model::ConfigFromSpec,
// runtime/model/from_spec.h).
kernels::AdamWOptions AdamWOptionsFor(const spec::JobSpec& spec);

// This rank's data order and shard (ParallelDims), for data::TokenLoader.
data::LoaderOptions LoaderFor(const Plan& p);

// Whether this job's linear layers compute in bf16 on this machine (kernels::ExecContext::
// bf16_linear, docs/model.md "Precision"): precision.param_dtype bf16, no precision.overrides
// entry keeping a matrix (a 2-D parameter) out of bf16 (the switch is per job, not per layer), and
// kernels::HasNativeBf16Gemm() (avx512_bf16 or AMX-BF16, oneDNN). *why: one line saying which and
// why; Train logs it once per node (local rank 0) when param_dtype is bf16.
bool Bf16LinearFor(const Plan& plan, std::string* why);

// Learning rate at optimizer step `step` (1-based): linear warmup, then constant or cosine down to
// min_lr_ratio * lr at the last step.
float LearningRate(const spec::JobSpec& spec, int64_t step);

// Trains one attempt. The store connection it opens is left open when it returns: the caller
// ends the process (worker_main.cc: _exit after flushing logs), so gRPC channel teardown never
// runs in a worker. Everything a worker must leave behind (checkpoints, progress, its exit
// record) is written before Train returns. REQUIRES: called once per process.
// *drained (may be null): the job's drain key made every rank save a checkpoint and stop early
// (exit kExitDrained, stop_watch.h); the status is then OK.
absl::Status Train(const Plan& plan, bool* drained = nullptr);

// The worker's store client (token, TLS from `env`), fenced by its attempt: every write carries
// (job::keys::Fence(job), env.attempt) and is refused once a newer attempt of the job started
// (store::IsFenced). Train uses it; so does the multihost fencing test's stale writer.
absl::StatusOr<store::Client> ConnectJobStore(const job::WorkerEnv& env);

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_TRAINER_H_
