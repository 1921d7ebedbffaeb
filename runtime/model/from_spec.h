// The model side of a job spec: the GptConfig a (defaulted) spec describes, the checks that need
// the model library (GptConfig::Validate, precision override patterns that match no parameter),
// and spec::Resolve, the one resolution of a spec that the daemon runs at Submit (and a worker
// runs once when given a spec that was never resolved). Here rather than in runtime/jobspec
// because the jobspec layer sits below runtime/model (tools/check_deps.sh); emberd and
// ember-worker both link it. Pure functions; thread-safe.
//
//   ASSIGN_OR_RETURN(spec::JobSpec resolved, spec::Resolve(parsed, facts));   // emberd Submit
//   ASSIGN_OR_RETURN(model::GptConfig cfg, model::ConfigFromSpec(resolved));  // ember-worker
#ifndef EMBER_RUNTIME_MODEL_FROM_SPEC_H_
#define EMBER_RUNTIME_MODEL_FROM_SPEC_H_

#include "absl/status/statusor.h"
#include "runtime/jobspec/resolve.h"
#include "runtime/jobspec/spec.h"
#include "runtime/model/gpt.h"

namespace ember::model {

// The model of a defaulted, validated spec (model.* and loss.*). INVALID_ARGUMENT naming the
// field ("model: ...") when GptConfig::Validate refuses it.
absl::StatusOr<GptConfig> ConfigFromSpec(const spec::JobSpec& spec);

// The model's checks: for gpt and llama ConfigFromSpec; for another model.arch the registered
// factory (runtime/model/registry.h; a name this build has not registered is INVALID_ARGUMENT
// "model.arch: ... registered: ..."). Then every precision.overrides[i].pattern must match at least one parameter of
// that model (an override that matches none is almost always a wrong name, e.g. "*norm*" for the
// norms, which are named ln1/ln2/ln_f): INVALID_ARGUMENT "precision.overrides[i].pattern: ...".
// Script jobs have no model: OK.
absl::Status CheckModel(const spec::JobSpec& spec);

}  // namespace ember::model

namespace ember::spec {

// THE resolution of a spec (issue 32 item 8): ResolveFields (runtime/jobspec/resolve.h:
// defaults, validation, device/backend, world, parallel dims, the support matrix, the marker),
// then model::CheckModel. What it accepts, every rank accepts at start (given the data files);
// what it refuses is INVALID_ARGUMENT naming the field.
absl::StatusOr<JobSpec> Resolve(const JobSpec& spec, const Facts& facts);

}  // namespace ember::spec

#endif  // EMBER_RUNTIME_MODEL_FROM_SPEC_H_
