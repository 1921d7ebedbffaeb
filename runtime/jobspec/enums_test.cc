// The one parser of each enumerated spec string: every spelling round-trips through Name, and an
// unknown one is refused naming the field and listing the allowed spellings.
#include "runtime/jobspec/enums.h"

#include <catch2/catch.hpp>

#include "runtime/jobspec/spec.h"

namespace ember::spec {
namespace {

TEST_CASE("enums: one parser each, round trip through Name") {
  for (Arch a : {Arch::kGpt, Arch::kLlama}) CHECK(*ParseArch("f", Name(a)) == a);
  for (Mlp m : {Mlp::kGelu, Mlp::kSwiGlu, Mlp::kMoe}) CHECK(*ParseMlp("f", Name(m)) == m);
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kInterleaved1F1B, Schedule::kZBH1})
    CHECK(*ParseSchedule("f", Name(s)) == s);
  for (Dtype d : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) CHECK(*ParseDtype("f", Name(d)) == d);
  for (Backend b : {Backend::kCpu, Backend::kNccl, Backend::kNcclLazy, Backend::kNcclLegacy})
    CHECK(*ParseBackend("f", Name(b)) == b);
  // The spellings users write (docs/job-spec.md), not the enum's order by accident.
  CHECK(std::string(Name(Schedule::kInterleaved1F1B)) == "interleaved_1f1b");
  CHECK(std::string(Name(Backend::kNcclLazy)) == "nccl-lazy");
  for (ReplicaMode r : {ReplicaMode::kNone, ReplicaMode::kMemory}) CHECK(*ParseReplicaMode("f", Name(r)) == r);
  CHECK(*ParseReplicaMode("f", "") == ReplicaMode::kNone);
  CHECK(ParseReplicaMode("fault_tolerance.replicas", "disk").status().message() ==
        "fault_tolerance.replicas: 'disk' is not allowed; use one of none, memory");
  CHECK(IsNccl(Backend::kNcclLegacy));
  CHECK_FALSE(IsNccl(Backend::kCpu));
  CHECK(ParseMlp("model.mlp", "relu").status().message() ==
        "model.mlp: 'relu' is not allowed; use one of gelu, swiglu, moe");
  CHECK(ParseDtype("precision.param_dtype", "fp32").status().message() ==
        "precision.param_dtype: 'fp32' is not allowed; use one of f32, bf16, f16");
  CHECK(ParseSchedule("parallelism.pipeline_schedule", "").status().message() ==
        "parallelism.pipeline_schedule: '' is not allowed; use one of gpipe, 1f1b, interleaved_1f1b, zbh1");
  // The spec's validation uses the same parsers (same words).
  CHECK(ParseArch("model.arch", "bert").status().message() ==
        "model.arch: 'bert' is not allowed; use one of gpt, llama");
  // Another well-formed name may be an architecture registered in the worker's build (checked by
  // spec::Resolve, which sees the registry); a malformed one is refused here.
  CHECK(ParseJobSpec("model: {arch: bert}").ok());
  CHECK(ParseJobSpec("model: {arch: Bert-2}").status().message().find(
            "model.arch: 'Bert-2' is not an architecture name: gpt, llama, or one registered") == 0);
  CHECK(ParseJobSpec("parallelism: {backend: gloo}").status().message() ==
        "parallelism.backend: 'gloo' is not allowed; use one of cpu, nccl, nccl-lazy, nccl-legacy");
}

}  // namespace
}  // namespace ember::spec
