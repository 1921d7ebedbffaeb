// Job specs: YAML or JSON text -> a validated ember.spec.v1.JobSpec (proto/job_spec.proto).
//
//   ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(text));   // defaults applied, validated
//
// Errors are INVALID_ARGUMENT and name the field path and the allowed values, e.g.
// "model.mlp: 'relu' is not allowed; use one of gelu, swiglu, moe". A spec that parses is safe to
// train on: every value is in range. Thread-safe (pure functions).
#ifndef EMBER_RUNTIME_SPEC_SPEC_H_
#define EMBER_RUNTIME_SPEC_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/job_spec.pb.h"

namespace ember::spec {

using JobSpec = ::ember::spec::v1::JobSpec;

// worker.python when a script job names none.
inline constexpr char kDefaultPython[] = "/usr/bin/python3";

// A script job (worker.script set): the daemon runs the user's program instead of ember-worker.
inline bool IsScriptJob(const JobSpec& spec) { return !spec.worker().script().empty(); }

// Parses YAML (JSON is valid YAML) for emberctl and tests; the daemon then resolves it
// (resolve.h, runtime/model/from_spec.h), which also applies the support matrix. Rejects unknown keys, duplicate keys (naming the line), wrong
// types, non-finite floats and an empty spec, applies defaults to unset fields and validates.
// Inputs larger than 1 MiB are rejected.
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& text);
// The same with parallelism.world_size set to `world_size` (> 0) before defaults and validation
// (emberctl --nproc).
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& text, int world_size);

// Reads and parses a file (NotFound / PermissionDenied name the path).
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);

// Fills unset fields with documented defaults (idempotent). An explicitly set 0 is kept for the
// fields whose default is not 0 (they are `optional` in the proto), so ValidateJobSpec sees it.
void ApplyDefaults(JobSpec* spec);

// Checks ranges, allowed values and combinations that can never mean anything
// (checkpoint.init_from on a model other than llama/swiglu, ...): INVALID_ARGUMENT naming the
// field. What ember-worker cannot train YET (a pipeline job with grad_clip, HSDP, ...) is the
// support matrix, checked by spec::Resolve (resolve.h CheckSupported). Assumes defaults applied.
absl::Status ValidateJobSpec(const JobSpec& spec);

// What a built-in job (not a script job) needs of the number of ranks it runs on: `world` a
// multiple of parallelism.pipeline_stages, 1 for strategy "none", parallelism.world_size when set.
// INVALID_ARGUMENT naming the field. The daemon checks it at Submit with the world it computed,
// each worker at its start with EMBER_WORLD_SIZE.
absl::Status CheckWorldSize(const JobSpec& spec, int world);

// Job names: 1 to kMaxJobNameBytes characters of [A-Za-z0-9._-], the first a letter or digit
// (regex [A-Za-z0-9][A-Za-z0-9._-]{0,62}). So a name, and the job id derived from it, is never
// ".", "..", an option ("-x") or a path, and never carries a control character into a log line.
// INVALID_ARGUMENT shows the name C-escaped.
inline constexpr size_t kMaxJobNameBytes = 63;
absl::Status ValidateJobName(const std::string& name);

// Human-readable one-line summary ("tiny-gpt: 4 layers x 128, fsdp on 4 cpu ranks, 200 steps").
std::string Summarize(const JobSpec& spec);

}  // namespace ember::spec

#endif  // EMBER_RUNTIME_SPEC_SPEC_H_
