// Pipeline fields of the job spec: defaults, and impossible layouts refused naming the numbers.
#include "runtime/jobspec/pipeline_layout.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/jobspec/spec.h"

namespace ember::spec {
namespace {

absl::StatusOr<JobSpec> Parse(const std::string& parallelism, int layers = 4) {
  return ParseJobSpec(absl::StrCat("model: {n_layers: ", layers, ", n_heads: 2, d_model: 32}\n",
                                   "data: {text_path: c.txt}\nparallelism: ", parallelism, "\n"));
}

std::string Error(const std::string& parallelism, int layers = 4) {
  auto s = Parse(parallelism, layers);
  return s.ok() ? "ok" : std::string(s.status().message());
}

TEST_CASE("pipeline layout: defaults") {
  auto s = Parse("{strategy: pipeline, pipeline_stages: 2}");
  REQUIRE(s.ok());
  PipelineLayout pl = PipelineLayoutOf(*s);
  CHECK(pl.enabled());
  CHECK(pl.ranks == 2);
  CHECK(pl.schedule == "1f1b");
  CHECK(pl.micro_batches == 2);
  CHECK(pl.virtual_stages == 1);
  CHECK(pl.stages() == 2);
  s = Parse("{strategy: pipeline, pipeline_stages: 2, pipeline_schedule: interleaved_1f1b, "
            "pipeline_micro_batches: 4}");
  REQUIRE(s.ok());
  pl = PipelineLayoutOf(*s);
  CHECK(pl.virtual_stages == 2);
  CHECK(pl.stages() == 4);
  CHECK(pl.micro_batches == 4);
  s = Parse("{strategy: fsdp}");
  REQUIRE(s.ok());
  CHECK(!PipelineLayoutOf(*s).enabled());
  CHECK(Error("{strategy: pipeline, pipeline_stages: 4, pipeline_schedule: gpipe, "
              "pipeline_micro_batches: 1, world_size: 8}") == "ok");  // GPipe takes m < p
}

TEST_CASE("pipeline layout: impossible layouts are refused naming the numbers") {
  CHECK(Error("{strategy: pipeline, pipeline_stages: 3}") ==
        "parallelism.pipeline_stages: model.n_layers 4 is not divisible by the 3 model stages "
        "(3 pipeline_stages x 1 virtual stages); use a multiple of 3 layers");
  CHECK(Error("{strategy: pipeline, pipeline_stages: 2, pipeline_schedule: interleaved_1f1b}",
              6) ==
        "parallelism.pipeline_stages: model.n_layers 6 is not divisible by the 4 model stages "
        "(2 pipeline_stages x 2 virtual stages); use a multiple of 4 layers");
  CHECK(Error("{strategy: pipeline, pipeline_stages: 4, pipeline_micro_batches: 3}") ==
        "parallelism.pipeline_micro_batches: 3 micro-batches is fewer than the 4 stages, which "
        "1f1b needs; use at least 4");
  CHECK(Error("{strategy: pipeline, pipeline_stages: 2, pipeline_schedule: zbh1, "
              "pipeline_micro_batches: 1}") ==
        "parallelism.pipeline_micro_batches: 1 micro-batches is fewer than the 2 stages, which "
        "zbh1 needs; use at least 2");
  CHECK(Error("{strategy: pipeline, pipeline_stages: 2, pipeline_schedule: interleaved_1f1b, "
              "pipeline_micro_batches: 3}", 8) ==
        "parallelism.pipeline_micro_batches: 3 micro-batches is not a multiple of the 2 pipeline "
        "stages, which interleaved_1f1b needs");
  CHECK(Error("{strategy: pipeline, pipeline_stages: 2, world_size: 3}") ==
        "parallelism.world_size: 3 ranks is not pipeline_stages (2) x an FSDP size (3 / 2 is not "
        "whole); use a multiple of 2, e.g. 4 = 2 x 2");
  CHECK(Error("{strategy: pipeline, pipeline_stages: 4, world_size: 10}", 4) ==
        "parallelism.world_size: 10 ranks is not pipeline_stages (4) x an FSDP size (10 / 4 is not "
        "whole); use a multiple of 4, e.g. 12 = 4 x 3");
  CHECK(Error("{strategy: pipeline, pipeline_stages: 2, world_size: 8}") == "ok");  // 2 x FSDP 4
  CHECK(Error("{strategy: pipeline, pipeline_stages: 2, pipeline_schedule: pipedream}") ==
        "parallelism.pipeline_schedule: 'pipedream' is not allowed; use one of gpipe, 1f1b, "
        "interleaved_1f1b, zbh1");
  CHECK(Error("{strategy: pipeline}") ==
        "parallelism.pipeline_stages: 0: strategy 'pipeline' needs at least 2 stages");
  CHECK(Error("{strategy: fsdp, pipeline_stages: 2}") ==
        "parallelism.pipeline_stages: 2 stages with strategy 'fsdp': set parallelism.strategy: "
        "pipeline (each stage is then FSDP-sharded over world_size / pipeline_stages ranks)");
  CHECK(Error("{strategy: pipeline, pipeline_stages: 2, pipeline_virtual_stages: 2}") ==
        "parallelism.pipeline_virtual_stages: 2 chunks per rank need pipeline_schedule "
        "interleaved_1f1b, not 1f1b");
  CHECK(Error("{strategy: pipeline, pipeline_stages: 2, micro_batches: 2}") ==
        "parallelism.micro_batches: 2 gradient-accumulation steps with a pipeline; use "
        "pipeline_micro_batches");
  CHECK(Error("{strategy: pipeline, pipeline_stages: -2}") ==
        "parallelism.pipeline_stages: -2 is out of range; allowed 0 to 65536");
}

}  // namespace
}  // namespace ember::spec
