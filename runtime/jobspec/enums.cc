#include "runtime/jobspec/enums.h"

#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/jobspec/pipeline_layout.h"

namespace ember::spec {
namespace {

// One table per enum: (value, spelling), in the order errors list them.
template <typename E>
using Table = std::vector<std::pair<E, const char*>>;

const Table<Arch> kArch = {{Arch::kGpt, "gpt"}, {Arch::kLlama, "llama"}};
const Table<Mlp> kMlp = {{Mlp::kGelu, "gelu"}, {Mlp::kSwiGlu, "swiglu"}, {Mlp::kMoe, "moe"}};
const Table<Schedule> kSchedule = {{Schedule::kGPipe, "gpipe"},
                                   {Schedule::k1F1B, "1f1b"},
                                   {Schedule::kInterleaved1F1B, "interleaved_1f1b"},
                                   {Schedule::kZBH1, "zbh1"}};
const Table<Dtype> kDtype = {{Dtype::kF32, "f32"}, {Dtype::kBF16, "bf16"}, {Dtype::kF16, "f16"}};
const Table<Backend> kBackend = {{Backend::kCpu, "cpu"},
                                 {Backend::kNccl, "nccl"},
                                 {Backend::kNcclLazy, "nccl-lazy"},
                                 {Backend::kNcclLegacy, "nccl-legacy"}};
const Table<ReplicaMode> kReplicaMode = {{ReplicaMode::kNone, "none"}, {ReplicaMode::kMemory, "memory"}};

template <typename E>
absl::StatusOr<E> Parse(const Table<E>& t, const std::string& field, const std::string& text) {
  std::string allowed;
  for (const auto& [v, name] : t) {
    if (text == name) return v;
    absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", name);
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": '", text, "' is not allowed; use one of ", allowed));
}

template <typename E>
const char* NameOf(const Table<E>& t, E v) {
  for (const auto& [e, name] : t)
    if (e == v) return name;
  return "?";
}

}  // namespace

absl::StatusOr<Arch> ParseArch(const std::string& f, const std::string& t) { return Parse(kArch, f, t); }
absl::StatusOr<Mlp> ParseMlp(const std::string& f, const std::string& t) { return Parse(kMlp, f, t); }
absl::StatusOr<Schedule> ParseSchedule(const std::string& f, const std::string& t) { return Parse(kSchedule, f, t); }
absl::StatusOr<Dtype> ParseDtype(const std::string& f, const std::string& t) { return Parse(kDtype, f, t); }
absl::StatusOr<Backend> ParseBackend(const std::string& f, const std::string& t) { return Parse(kBackend, f, t); }
absl::StatusOr<ReplicaMode> ParseReplicaMode(const std::string& f, const std::string& t) {
  return t.empty() ? ReplicaMode::kNone : Parse(kReplicaMode, f, t);
}

const char* Name(Arch a) { return NameOf(kArch, a); }
const char* Name(Mlp m) { return NameOf(kMlp, m); }
const char* Name(Schedule s) { return NameOf(kSchedule, s); }
const char* Name(Dtype d) { return NameOf(kDtype, d); }
const char* Name(Backend b) { return NameOf(kBackend, b); }
const char* Name(ReplicaMode r) { return NameOf(kReplicaMode, r); }

bool IsBuiltinArch(const std::string& name) { return ParseArch("model.arch", name).ok(); }

absl::Status CheckArchName(const std::string& field, const std::string& name) {
  if (IsBuiltinArch(name)) return absl::OkStatus();
  bool ok = !name.empty() && name.size() <= 32 && name[0] >= 'a' && name[0] <= 'z';
  for (char c : name) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": '", absl::CHexEscape(name.substr(0, 64)), "' is not an architecture name: gpt, llama, or one "
      "registered in the worker's build (1-32 of a-z, 0-9, _, starting with a letter; docs/adding-a-model.md)"));
}

Arch ArchOf(const v1::JobSpec& s) { return ParseArch("model.arch", s.model().arch()).value_or(Arch::kGpt); }
Mlp MlpOf(const v1::JobSpec& s) { return ParseMlp("model.mlp", s.model().mlp()).value_or(Mlp::kGelu); }
Schedule ScheduleOf(const v1::JobSpec& s) {
  return ParseSchedule("parallelism.pipeline_schedule", PipelineLayoutOf(s).schedule).value_or(Schedule::k1F1B);
}
Backend BackendOf(const v1::JobSpec& s) {
  return ParseBackend("parallelism.backend", s.parallelism().backend()).value_or(Backend::kCpu);
}

ReplicaMode ReplicaModeOf(const v1::JobSpec& s) {
  return ParseReplicaMode("fault_tolerance.replicas", s.fault_tolerance().replicas()).value_or(ReplicaMode::kNone);
}

}  // namespace ember::spec
