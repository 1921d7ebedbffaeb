// The job spec's enumerated strings, each with ONE parser used everywhere (issue 32 item 8):
// model.arch, model.mlp, parallelism.pipeline_schedule, the precision dtypes,
// parallelism.backend and fault_tolerance.replicas. The spec keeps them as strings (the YAML keys users write); code that
// branches on them parses them here instead of comparing strings. Errors are INVALID_ARGUMENT
// "<field>: '<text>' is not allowed; use one of a, b, c". Pure; thread-safe.
//
//   ASSIGN_OR_RETURN(spec::Mlp mlp, spec::ParseMlp("model.mlp", s.model().mlp()));
#ifndef EMBER_RUNTIME_JOBSPEC_ENUMS_H_
#define EMBER_RUNTIME_JOBSPEC_ENUMS_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/job_spec.pb.h"

namespace ember::spec {

enum class Arch { kGpt, kLlama };                                // "gpt" | "llama"
enum class Mlp { kGelu, kSwiGlu, kMoe };                          // "gelu" | "swiglu" | "moe"
enum class Schedule { kGPipe, k1F1B, kInterleaved1F1B, kZBH1 };   // "gpipe" | "1f1b" | "interleaved_1f1b" | "zbh1"
enum class Dtype { kF32, kBF16, kF16 };                           // "f32" | "bf16" | "f16"
enum class Backend { kCpu, kNccl, kNcclLazy, kNcclLegacy };       // "cpu" | "nccl" | "nccl-lazy" | "nccl-legacy"
enum class ReplicaMode { kNone, kMemory };                        // "none" (or "") | "memory"

absl::StatusOr<Arch> ParseArch(const std::string& field, const std::string& text);
absl::StatusOr<Mlp> ParseMlp(const std::string& field, const std::string& text);
absl::StatusOr<Schedule> ParseSchedule(const std::string& field, const std::string& text);
absl::StatusOr<Dtype> ParseDtype(const std::string& field, const std::string& text);
absl::StatusOr<Backend> ParseBackend(const std::string& field, const std::string& text);
absl::StatusOr<ReplicaMode> ParseReplicaMode(const std::string& field, const std::string& text);  // "" = none

// The spelling a spec uses (the inverse of the parsers).
const char* Name(Arch a);
const char* Name(Mlp m);
const char* Name(Schedule s);
const char* Name(Dtype d);
const char* Name(Backend b);
const char* Name(ReplicaMode r);

// The device backends (NCCL: they run on resources.device_type cuda).
inline bool IsNccl(Backend b) { return b != Backend::kCpu; }

// The values of a defaulted, validated spec (ValidateJobSpec passed), for code that branches on
// them. A spelling the parser refuses (possible only in an unvalidated spec) reads as the default:
// gpt, gelu, 1f1b (PipelineLayoutOf's schedule), cpu (an empty backend, before resolution, too).
Arch ArchOf(const ::ember::spec::v1::JobSpec& spec);

// model.arch names another architecture than the built-in gpt and llama: one registered in the
// worker's build (runtime/model/registry.h; docs/adding-a-model.md). This layer cannot see the
// registry, so it checks only the name's form (1-32 of [a-z0-9_], starting with a letter);
// spec::Resolve (runtime/model/from_spec.h) refuses a name the build has not registered.
bool IsBuiltinArch(const std::string& name);
absl::Status CheckArchName(const std::string& field, const std::string& name);
Mlp MlpOf(const ::ember::spec::v1::JobSpec& spec);
Schedule ScheduleOf(const ::ember::spec::v1::JobSpec& spec);
Backend BackendOf(const ::ember::spec::v1::JobSpec& spec);
ReplicaMode ReplicaModeOf(const ::ember::spec::v1::JobSpec& spec);  // fault_tolerance.replicas; none

}  // namespace ember::spec

#endif  // EMBER_RUNTIME_JOBSPEC_ENUMS_H_
