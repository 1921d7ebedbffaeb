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

// Parses YAML (JSON is valid YAML), rejects unknown keys and wrong types, applies defaults and
// validates. Inputs larger than 1 MiB are rejected.
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& text);

// Reads and parses a file (NotFound / PermissionDenied name the path).
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);

// Fills unset fields with documented defaults (idempotent).
void ApplyDefaults(JobSpec* spec);

// Checks ranges and allowed values; assumes defaults were applied.
absl::Status ValidateJobSpec(const JobSpec& spec);

// Human-readable one-line summary ("tiny-gpt: 4 layers x 128, fsdp on 4 cpu ranks, 200 steps").
std::string Summarize(const JobSpec& spec);

}  // namespace ember::spec

#endif  // EMBER_RUNTIME_SPEC_SPEC_H_
