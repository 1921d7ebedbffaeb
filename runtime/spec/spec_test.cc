#include <random>

#include <catch2/catch.hpp>

#include "runtime/spec/spec.h"

namespace ember::spec {
namespace {

const char* kGood = R"(
name: tiny-gpt
model: {n_layers: 2, d_model: 64, n_heads: 4, context_length: 64, mlp: swiglu}
optimizer: {lr: 0.003, schedule: cosine, warmup_steps: 10}
parallelism: {strategy: fsdp, world_size: 4}
precision:
  param_dtype: bf16
  overrides:
    - {pattern: "*norm*", param_dtype: f32}
steps: 50
seed: 7
)";

TEST_CASE("a good YAML spec parses with defaults applied") {
  auto s = ParseJobSpec(kGood);
  REQUIRE(s.ok());
  REQUIRE(s->model().n_layers() == 2);
  REQUIRE(s->model().vocab_size() == 256);
  REQUIRE(s->optimizer().beta2() == Approx(0.95f));
  REQUIRE(s->precision().overrides(0).param_dtype() == "f32");
  REQUIRE(s->precision().output_dtype() == "bf16");
  REQUIRE(Summarize(*s).find("tiny-gpt") == 0);
}

TEST_CASE("JSON is accepted too") {
  auto s = ParseJobSpec(R"({"name": "j", "steps": 3, "model": {"n_layers": 1}})");
  REQUIRE(s.ok());
  REQUIRE(s->steps() == 3);
}

TEST_CASE("errors name the field and the allowed values") {
  auto s = ParseJobSpec("model: {mlp: relu}");
  REQUIRE(absl::IsInvalidArgument(s.status()));
  REQUIRE(s.status().message() == "model.mlp: 'relu' is not allowed; use one of gelu, swiglu, moe");
  s = ParseJobSpec("model: {nlayers: 3}");
  REQUIRE(s.status().message().find("model.nlayers: unknown field; allowed here: vocab_size") == 0);
  s = ParseJobSpec("steps: many");
  REQUIRE(s.status().message().find("steps: 'many' is not a valid") == 0);
  s = ParseJobSpec("model: {d_model: 30, n_heads: 4}");
  REQUIRE(s.status().message().find("not divisible") != std::string::npos);
  s = ParseJobSpec("data: {path: ../etc/passwd}");
  REQUIRE(s.status().message().find("data.path") == 0);
  // Absolute data paths parse; the daemon admits them only under a data root (spec_policy.h).
  REQUIRE(ParseJobSpec("data: {path: /datasets/tokens.bin}").ok());
  s = ParseJobSpec("checkpoint: {dir: ../../x}");
  REQUIRE(s.status().message().find("checkpoint.dir") == 0);
  s = ParseJobSpec("precision: {overrides: [{pattern: x, param_dtype: f8}]}");
  REQUIRE(s.status().message().find("precision.overrides[0].param_dtype") == 0);
  s = ParseJobSpec("model: [1, 2]");
  REQUIRE(s.status().message().find("model: expected a mapping") == 0);
  s = ParseJobSpec("{unclosed");
  REQUIRE(absl::IsInvalidArgument(s.status()));
}

TEST_CASE("a fuzzed corpus never crashes and never yields an invalid spec") {
  std::mt19937 rng(1234);
  std::string base = kGood;
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string t = base;
    int edits = 1 + rng() % 4;
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % t.size();
      switch (rng() % 3) {
        case 0: t[pos] = static_cast<char>(rng() % 128); break;
        case 1: t.erase(pos, 1 + rng() % 8); break;
        default: t.insert(pos, std::string(1 + rng() % 3, "{}[]:,-'\"#\n 9x"[rng() % 15])); break;
      }
      if (t.empty()) t = "x";
    }
    auto s = ParseJobSpec(t);
    if (s.ok()) {
      ++accepted;
      REQUIRE(ValidateJobSpec(*s).ok());
    } else {
      REQUIRE(absl::IsInvalidArgument(s.status()));
      REQUIRE_FALSE(s.status().message().empty());
    }
  }
  WARN("fuzzed specs accepted: " << accepted << " of 3000");
}

}  // namespace
}  // namespace ember::spec
