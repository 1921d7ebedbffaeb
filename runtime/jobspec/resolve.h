// The spec resolved once (issue 32 item 8), the part that needs no model library: a parsed spec
// plus the facts of where it runs -> the one resolved spec the daemon stores as <job>/job.yaml and
// every rank trains from without re-defaulting it; and CheckSupported, the one table of what
// ember-worker can run.
//
//   emberd Submit:  ASSIGN_OR_RETURN(JobSpec r, spec::Resolve(parsed, facts));  // model/from_spec.h
//   ember-worker:   ASSIGN_OR_RETURN(JobSpec r, spec::LoadWorkerSpec(path, facts, &resolved_here));
//                   RETURN_IF_ERROR(spec::CheckResolvedFor(r, env.world_size));
//
// spec::Resolve (runtime/model/from_spec.h) is ResolveFields followed by the model's own checks
// (GptConfig::Validate, precision override patterns that match no parameter), which need
// runtime/model (a higher layer). Every refusal is INVALID_ARGUMENT starting with the field path.
// Thread-safe (pure functions).
#ifndef EMBER_RUNTIME_JOBSPEC_RESOLVE_H_
#define EMBER_RUNTIME_JOBSPEC_RESOLVE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/jobspec/spec.h"

namespace ember::spec {

// resolved.version of a spec Resolve produced. A worker refuses any other value (0 = a spec that
// was never resolved: an old job directory, or a hand-written job.yaml).
inline constexpr int kResolvedVersion = 1;

// What the spec is resolved against.
struct Facts {
  // The world the job runs in when known (a worker: EMBER_WORLD_SIZE); 0 = derive it:
  // parallelism.world_size, else resources.devices_per_node x max(1, resources.nodes), else every
  // device of the job's kind in `devices` (at least 1).
  int world_size = 0;
  // The node inventory as the daemon knows it: devices per kind ("cpu", "cuda") over the
  // registered nodes.
  std::map<std::string, int> devices;
  // Not a fact here: whether a node's ember-worker was built with CUDA kernels (the daemon and the
  // workers may be different builds); ember-worker-cuda refuses that itself (CheckCudaPlan).
};

// One entry of the support matrix: a combination ember-worker cannot train (yet). `applies` says
// whether a resolved spec has it; `message` is the refusal after "<field>: ". `supported = true`
// turns the entry off (the one-line change when the worker learns the combination).
struct SupportRule {
  const char* name;      // short name, for docs and tests ("pipeline+grad_clip")
  const char* field;     // the field the refusal names
  bool supported;
  bool (*applies)(const JobSpec& resolved);
  std::string (*message)(const JobSpec& resolved);
};

// The matrix (resolve.cc, kSupportMatrix): every entry, supported or not.
const std::vector<SupportRule>& SupportMatrix();

// The first unsupported entry that applies to `resolved`, as INVALID_ARGUMENT "<field>: <why>";
// OK when none does. Script jobs are never refused here (ember-worker does not run them).
absl::Status CheckSupported(const JobSpec& resolved);

// Everything Resolve does that needs no model library: copies `spec`, drops any `resolved`
// section a user wrote, applies defaults, validates (ValidateJobSpec), takes the device type
// (resources.device_type) and fills parallelism.backend ("" -> nccl on cuda, cpu on cpu; a
// mismatch refused naming both), the world (Facts), CheckWorldSize, the parallel dims
// (parallelism.dp_replicate, the pipeline fields of a pipeline job filled in), CheckSupported, and
// stamps `resolved`. Idempotent: ResolveFields(ResolveFields(s)) == ResolveFields(s).
absl::StatusOr<JobSpec> ResolveFields(const JobSpec& spec, const Facts& facts);

// A resolved spec as YAML (what <job>/job.yaml holds): every field that is set, so that
// ParseWorkerSpec(ResolvedYaml(r)) == r.
std::string ResolvedYaml(const JobSpec& resolved);

// The worker's side. A spec with the marker (resolved.version == kResolvedVersion) is parsed
// WITHOUT applying defaults, validated and checked against the matrix: the worker trains on the
// daemon's resolution as written. A spec without it (a job.yaml not written by emberd's Submit:
// an old job directory, a test or hand-run worker) is resolved once here with `facts`, and
// *resolved_here says so (the caller logs it); docs/job-spec.md. Any other version is refused.
// NotFound names the path.
absl::StatusOr<JobSpec> LoadWorkerSpec(const std::string& path, const Facts& facts,
                                       bool* resolved_here);
absl::StatusOr<JobSpec> ParseWorkerSpec(const std::string& text, const Facts& facts,
                                        bool* resolved_here);

// A worker's check of the world it runs in (EMBER_WORLD_SIZE) against the one the spec was
// resolved for, and CheckWorldSize. INVALID_ARGUMENT naming parallelism.world_size.
absl::Status CheckResolvedFor(const JobSpec& resolved, int world_size);

}  // namespace ember::spec

#endif  // EMBER_RUNTIME_JOBSPEC_RESOLVE_H_
