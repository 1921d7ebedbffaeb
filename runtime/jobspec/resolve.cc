#include "runtime/jobspec/resolve.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/jobspec/enums.h"
#include "runtime/jobspec/parallel_dims.h"
#include "runtime/jobspec/pipeline_layout.h"
#include "runtime/jobspec/yaml_proto.h"
#include "yaml-cpp/yaml.h"

namespace ember::spec {
namespace {

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

bool Pipeline(const JobSpec& s) { return PipelineLayoutOf(s).enabled(); }
bool Cuda(const JobSpec& s) { return s.resources().device_type() == "cuda"; }
bool NotF32(const JobSpec& s) {
  const auto& p = s.precision();
  return p.param_dtype() != "f32" || p.output_dtype() != "f32" ||
         (!p.reduce_dtype().empty() && p.reduce_dtype() != "f32") || p.overrides_size() > 0;
}

// THE support matrix: what ember-worker cannot train yet. Flip `supported` to true (the third
// value) when the worker learns a combination; docs/job-spec.md shows this table.
const std::vector<SupportRule> kSupportMatrix = {
    {"pipeline+grad_clip", "optimizer.grad_clip", true,  // one global norm over stages and shards
     [](const JobSpec& s) { return Pipeline(s) && s.optimizer().grad_clip() > 0; },
     [](const JobSpec& s) {
       return absl::StrCat(s.optimizer().grad_clip(), ": pipeline jobs do not clip gradients yet; use 0");
     }},
    {"pipeline+precision", "precision", true,  // the stage's FullyShard takes the policy
     [](const JobSpec& s) { return Pipeline(s) && NotF32(s); },
     [](const JobSpec&) { return std::string("pipeline jobs train in f32 only; leave precision unset"); }},
    {"pipeline+init_from_safetensors", "checkpoint.init_from_safetensors", true,  // each stage loads its own
     [](const JobSpec& s) { return Pipeline(s) && !s.checkpoint().init_from_safetensors().empty(); },
     [](const JobSpec&) { return std::string("not supported for pipeline jobs yet"); }},
    {"pipeline+init_from", "checkpoint.init_from", true,  // each stage reads its own rows
     [](const JobSpec& s) { return Pipeline(s) && !s.checkpoint().init_from().empty(); },
     [](const JobSpec&) { return std::string("not supported for pipeline jobs yet"); }},
    {"pipeline+publish", "publish.every_steps", true,  // publisher.cc: every stage's tensors in one manifest
     [](const JobSpec& s) { return Pipeline(s) && s.publish().every_steps() > 0; },
     [](const JobSpec&) {
       return std::string("live weight publishing is not built for pipeline jobs (docs/onesided.md); leave it 0");
     }},
    {"hsdp", "parallelism.dp_replicate", true,  // trainer.cc CreateGroups: shard and replicate groups
     [](const JobSpec& s) { return s.parallelism().dp_replicate() > 1; },
     [](const JobSpec& s) {
       return absl::StrCat(s.parallelism().dp_replicate(), ": HSDP (replicated FSDP groups) is not built in "
                           "ember-worker yet; use 0 (plain FSDP over every rank)");
     }},
    {"pipeline+hsdp", "parallelism.dp_replicate", true,  // stage rows sharded per shard group, replicated across
     [](const JobSpec& s) { return Pipeline(s) && s.parallelism().dp_replicate() > 1; },
     [](const JobSpec& s) {
       return absl::StrCat(s.parallelism().dp_replicate(), " with a pipeline: a pipeline's stages are FSDP-sharded "
                           "over their whole stage group, not replicated yet; use 0");
     }},
    // The GPU step (ember-worker-cuda, runtime/worker/cuda_trainer.cc CheckCudaPlan): fp32, one rank
    // or data parallel over several (replicated on the devices, gradients all-reduced with nccl).
    {"cuda+pipeline", "parallelism.strategy", false,
     [](const JobSpec& s) { return Cuda(s) && Pipeline(s); },
     [](const JobSpec& s) {
       return absl::StrCat("'", s.parallelism().strategy(), "' on cuda: GPU training supports strategy none (one "
                           "rank) or fsdp (data parallel, replicated on the GPUs)");
     }},
    {"cuda+ranks", "parallelism.world_size", true,  // data parallel, gradients all-reduced on the devices
     [](const JobSpec& s) { return Cuda(s) && s.parallelism().world_size() > 1; },
     [](const JobSpec& s) {
       return absl::StrCat(s.parallelism().world_size(), " ranks on cuda: GPU training runs on one rank only; "
                           "use 1 rank or device cpu");
     }},
    {"cuda+hsdp", "parallelism.dp_replicate", false,
     [](const JobSpec& s) { return Cuda(s) && s.parallelism().dp_replicate() > 1; },
     [](const JobSpec& s) {
       return absl::StrCat(s.parallelism().dp_replicate(), " on cuda: GPU training has no HSDP; its ranks already "
                           "hold replicas (data parallel, gradients all-reduced on the GPUs); use 0 or device cpu");
     }},
    {"cuda+grad_accumulation", "parallelism.micro_batches", false,
     [](const JobSpec& s) { return Cuda(s) && s.parallelism().micro_batches() > 1; },
     [](const JobSpec& s) {
       return absl::StrCat(s.parallelism().micro_batches(), " on cuda: GPU training supports 1 micro-batch per step");
     }},
    {"cuda+precision", "precision", false,
     [](const JobSpec& s) { return Cuda(s) && NotF32(s); },
     [](const JobSpec&) {
       return std::string("on cuda GPU training is fp32 only (param, output and reduce dtype f32, no overrides); "
                          "leave precision unset or use device cpu");
     }},
    {"cuda+publish", "publish.every_steps", false,
     [](const JobSpec& s) { return Cuda(s) && s.publish().every_steps() > 0; },
     [](const JobSpec& s) {
       return absl::StrCat(s.publish().every_steps(), " on cuda: GPU training does not publish weights yet; use 0 "
                           "or device cpu");
     }},
    {"cuda+registered_arch", "model.arch", false,
     [](const JobSpec& s) { return Cuda(s) && !IsBuiltinArch(s.model().arch()); },
     [](const JobSpec& s) {
       return absl::StrCat("'", s.model().arch(), "' on cuda: the GPU step is written for gpt and llama only; "
                           "use device cpu (a registered architecture trains on the CPU stack)");
     }},
    {"cuda+moe", "model.mlp", false,
     [](const JobSpec& s) { return Cuda(s) && MlpOf(s) == Mlp::kMoe; },
     [](const JobSpec&) { return std::string("'moe' on cuda: the GPU step has no MoE; use gelu or swiglu, or device cpu"); }},
    {"cuda+head_size", "model.n_heads", false,
     [](const JobSpec& s) {
       const int hd = s.model().d_model() / std::max(1, s.model().n_heads());
       return Cuda(s) && hd != 32 && hd != 64;
     },
     [](const JobSpec& s) {
       return absl::StrCat("head size d_model / n_heads = ", s.model().d_model(), " / ", s.model().n_heads(), " = ",
                           s.model().d_model() / std::max(1, s.model().n_heads()),
                           " on cuda: the CUDA attention supports head sizes 32 and 64; choose n_heads so, or use "
                           "device cpu");
     }},
};


// Text -> JobSpec with nothing defaulted (ParseJobSpec's reading, without ApplyDefaults).
absl::StatusOr<JobSpec> ParseUndefaulted(const std::string& text) {
  if (text.size() > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("spec is ", text.size(), " bytes; the limit is ", 1 << 20));
  }
  JobSpec spec;
  RETURN_IF_ERROR(ParseYamlInto(text, &spec, "spec"));
  return spec;
}

}  // namespace

const std::vector<SupportRule>& SupportMatrix() { return kSupportMatrix; }

absl::Status CheckSupported(const JobSpec& s) {
  if (IsScriptJob(s)) return absl::OkStatus();
  for (const SupportRule& r : kSupportMatrix) {
    if (!r.supported && r.applies(s)) return Bad(r.field, r.message(s));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ResolveFields(const JobSpec& in, const Facts& facts) {
  JobSpec s = in;
  s.clear_resolved();
  ApplyDefaults(&s);
  RETURN_IF_ERROR(ValidateJobSpec(s));
  auto* par = s.mutable_parallelism();
  auto* res = s.mutable_resources();
  const std::string type = res->device_type();
  // The backend follows the devices: an empty one is `nccl` on cuda (PyTorch 2.15's default NCCL
  // process group) and `cpu` on cpu; an explicit mismatch is refused naming both fields.
  if (par->backend().empty()) {
    par->set_backend(type == "cuda" ? "nccl" : "cpu");
  } else if ((type == "cuda") != IsNccl(BackendOf(s))) {
    return Bad("parallelism.backend", absl::StrCat("'", par->backend(), "' does not run on resources.device_type '", type,
                                                   "' (cuda takes nccl, nccl-lazy or nccl-legacy; cpu takes cpu); "
                                                   "change one of them"));
  }
  int world = facts.world_size;
  if (world == 0) world = par->world_size();
  if (world == 0 && res->devices_per_node() > 0) world = res->devices_per_node() * std::max(1, res->nodes());
  if (world == 0) {  // "all devices placed": every device of the kind the cluster has now
    auto it = facts.devices.find(type);
    world = std::max(1, it == facts.devices.end() ? 0 : it->second);
  }
  v1::Resolution* r = s.mutable_resolved();
  if (IsScriptJob(s)) {  // a user's program: only the world and the devices are Ember's
    if (par->world_size() != 0 && par->world_size() != world) RETURN_IF_ERROR(CheckWorldSize(s, world));
    par->set_world_size(world);
    r->set_version(kResolvedVersion);
    r->set_world_size(world);
    return s;
  }
  RETURN_IF_ERROR(CheckWorldSize(s, world));
  ASSIGN_OR_RETURN(const ParallelDims dims, ParallelDims::FromSpec(s, world));
  par->set_world_size(world);
  par->set_dp_replicate(dims.dp_replicate());
  if (dims.pipeline()) {
    const PipelineLayout pl = PipelineLayoutOf(s);
    par->set_pipeline_schedule(pl.schedule);
    par->set_pipeline_micro_batches(pl.micro_batches);
    par->set_pipeline_virtual_stages(pl.virtual_stages);
  }
  RETURN_IF_ERROR(CheckSupported(s));
  r->set_version(kResolvedVersion);
  r->set_world_size(world);
  r->set_pp(dims.pp());
  r->set_dp_replicate(dims.dp_replicate());
  r->set_dp_shard(dims.dp_shard());
  r->set_virtual_stages(dims.virtual_stages());
  r->set_layout(dims.Layout());
  r->set_tokens_per_step(
      dims.TokensPerStep(ParallelDims::SequencesPerReplica(s), s.model().context_length()));
  return s;
}

std::string ResolvedYaml(const JobSpec& resolved) { return ToYaml(resolved); }

absl::StatusOr<JobSpec> ParseWorkerSpec(const std::string& text, const Facts& facts, bool* resolved_here) {
  ASSIGN_OR_RETURN(JobSpec s, ParseUndefaulted(text));
  *resolved_here = false;
  if (s.resolved().version() == 0) {
    *resolved_here = true;
    return ResolveFields(s, facts);
  }
  if (s.resolved().version() != kResolvedVersion) {
    return Bad("resolved.version", absl::StrCat(s.resolved().version(), " is not the version this ember-worker reads (",
                                                kResolvedVersion, "); resubmit the job to the emberd of this release"));
  }
  // As written: no defaults. A resolved spec still has to be one this worker accepts.
  RETURN_IF_ERROR(base::Annotate(ValidateJobSpec(s), "resolved spec"));
  RETURN_IF_ERROR(base::Annotate(CheckSupported(s), "resolved spec"));
  return s;
}

absl::StatusOr<JobSpec> LoadWorkerSpec(const std::string& path, const Facts& facts, bool* resolved_here) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open job spec '", path, "'"));
  std::stringstream ss;
  ss << f.rdbuf();
  auto spec = ParseWorkerSpec(ss.str(), facts, resolved_here);
  if (!spec.ok()) return base::Annotate(spec.status(), path);
  return spec;
}

absl::Status CheckResolvedFor(const JobSpec& s, int world_size) {
  if (s.resolved().world_size() != world_size) {
    return Bad("parallelism.world_size", absl::StrCat("the job was resolved for ", s.resolved().world_size(),
                                                      " ranks, but this rank runs in a world of ", world_size,
                                                      " (EMBER_WORLD_SIZE); resubmit the job"));
  }
  return CheckWorldSize(s, world_size);
}

}  // namespace ember::spec
