#include "runtime/jobspec/pipeline_layout.h"

#include "absl/strings/str_cat.h"
#include "runtime/jobspec/enums.h"

namespace ember::spec {
namespace {

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("parallelism.", field, ": ", why));
}

}  // namespace

PipelineLayout PipelineLayoutOf(const v1::JobSpec& spec) {
  const v1::ParallelismConfig& p = spec.parallelism();
  PipelineLayout pl;
  pl.ranks = std::max(1, p.pipeline_stages());
  pl.schedule = p.pipeline_schedule().empty() ? "1f1b" : p.pipeline_schedule();
  pl.virtual_stages = p.pipeline_virtual_stages() > 0     ? p.pipeline_virtual_stages()
                      : ParseSchedule("", pl.schedule).value_or(Schedule::k1F1B) == Schedule::kInterleaved1F1B ? 2
                                                          : 1;
  pl.micro_batches = p.pipeline_micro_batches() > 0 ? p.pipeline_micro_batches() : pl.ranks;
  return pl;
}

absl::Status ValidatePipelineLayout(const v1::JobSpec& spec) {
  const v1::ParallelismConfig& p = spec.parallelism();
  for (const auto& [field, v] : {std::pair<const char*, int>{"pipeline_stages", p.pipeline_stages()},
                                 {"pipeline_micro_batches", p.pipeline_micro_batches()},
                                 {"pipeline_virtual_stages", p.pipeline_virtual_stages()}}) {
    if (v < 0 || v > (1 << 16)) {
      return Bad(field, absl::StrCat(v, " is out of range; allowed 0 to ", 1 << 16));
    }
  }
  const PipelineLayout pl = PipelineLayoutOf(spec);
  auto kind = ParseSchedule("parallelism.pipeline_schedule", pl.schedule);
  if (!kind.ok()) return kind.status();
  const bool pipeline = p.strategy() == "pipeline";
  if (pipeline && !pl.enabled()) {
    return Bad("pipeline_stages", absl::StrCat(p.pipeline_stages(),
                                               ": strategy 'pipeline' needs at least 2 stages"));
  }
  if (!pipeline && pl.enabled()) {
    return Bad("pipeline_stages", absl::StrCat(
        p.pipeline_stages(), " stages with strategy '", p.strategy(),
        "': set parallelism.strategy: pipeline (each stage is then FSDP-sharded over "
        "world_size / pipeline_stages ranks)"));
  }
  if (!pl.enabled()) return absl::OkStatus();
  if (pl.virtual_stages != 1 && *kind != Schedule::kInterleaved1F1B) {
    return Bad("pipeline_virtual_stages",
               absl::StrCat(pl.virtual_stages, " chunks per rank need pipeline_schedule "
                            "interleaved_1f1b, not ", pl.schedule));
  }
  const int64_t layers = spec.model().n_layers(), S = pl.stages();
  if (layers % S != 0) {
    return Bad("pipeline_stages",
               absl::StrCat("model.n_layers ", layers, " is not divisible by the ", S,
                            " model stages (", pl.ranks, " pipeline_stages x ", pl.virtual_stages,
                            " virtual stages); use a multiple of ", S, " layers"));
  }
  if ((*kind == Schedule::k1F1B || *kind == Schedule::kZBH1) && pl.micro_batches < pl.ranks) {
    return Bad("pipeline_micro_batches",
               absl::StrCat(pl.micro_batches, " micro-batches is fewer than the ", pl.ranks,
                            " stages, which ", pl.schedule, " needs; use at least ", pl.ranks));
  }
  if (*kind == Schedule::kInterleaved1F1B && pl.micro_batches % pl.ranks != 0) {
    return Bad("pipeline_micro_batches",
               absl::StrCat(pl.micro_batches, " micro-batches is not a multiple of the ",
                            pl.ranks, " pipeline stages, which interleaved_1f1b needs"));
  }
  if (p.world_size() != 0 && p.world_size() % pl.ranks != 0) {
    return Bad("world_size",
               absl::StrCat(p.world_size(), " ranks is not pipeline_stages (", pl.ranks,
                            ") x an FSDP size (", p.world_size(), " / ", pl.ranks,
                            " is not whole); use a multiple of ", pl.ranks, ", e.g. ",
                            pl.ranks * (p.world_size() / pl.ranks + 1), " = ", pl.ranks, " x ",
                            p.world_size() / pl.ranks + 1));
  }
  if (p.micro_batches() > 1) {
    return Bad("micro_batches", absl::StrCat(p.micro_batches(), " gradient-accumulation steps "
                                             "with a pipeline; use pipeline_micro_batches"));
  }
  return absl::OkStatus();
}

}  // namespace ember::spec
