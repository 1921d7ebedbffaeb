// The submit-time memory estimate: its parameter count against the model's own parameter list
// (runtime/model ParamSpecs, an independent reference the daemon itself never links), and the
// fit decision against node memory.
#include "runtime/daemon/memory_estimate.h"

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "runtime/model/gpt.h"
#include "runtime/jobspec/spec.h"

namespace ember::daemon {
namespace {

int64_t ModelParams(const spec::v1::JobSpec& s) {
  model::GptConfig c;
  const auto& m = s.model();
  c.vocab_size = m.vocab_size();
  c.context = m.context_length();
  c.n_layer = m.n_layers();
  c.n_head = m.n_heads();
  c.d_model = m.d_model();
  c.d_ff = m.mlp_hidden();
  c.mlp = m.mlp() == "swiglu" ? model::GptConfig::Mlp::kSwiGlu
          : m.mlp() == "moe"  ? model::GptConfig::Mlp::kMoe
                              : model::GptConfig::Mlp::kGelu;
  c.n_expert = m.moe_experts();
  c.arch = m.arch() == "llama" ? model::GptConfig::Arch::kLlama : model::GptConfig::Arch::kGpt;
  c.n_kv_head = m.n_kv_heads();
  c.tie_embeddings = m.tie_embeddings();
  int64_t n = 0;
  for (const auto& p : model::ParamSpecs(c)) n += p.numel();
  return n;
}

jobs::v1::Node Node(const std::string& name, int cpus, int64_t ram) {
  jobs::v1::Node n;
  n.set_name(name);
  n.set_memory_total_bytes(ram);
  for (int i = 0; i < cpus; ++i) {
    auto* d = n.add_devices();
    d->set_id("cpu:" + std::to_string(i));
    d->set_kind("cpu");
  }
  return n;
}

TEST_CASE("the estimate counts the parameters the model has") {
  for (const char* model : {"{n_layers: 2, d_model: 64, n_heads: 4}",
                            "{n_layers: 3, d_model: 80, n_heads: 4, mlp: swiglu}",
                            "{n_layers: 1, d_model: 32, n_heads: 2, mlp: moe, moe_experts: 3}",
                            "{n_layers: 2, d_model: 48, n_heads: 4, mlp_hidden: 100, "
                            "vocab_size: 1000, context_length: 64}",
                            "{arch: llama, n_layers: 2, d_model: 64, n_heads: 4, n_kv_heads: 2}",
                            "{arch: llama, n_layers: 2, d_model: 64, n_heads: 8, n_kv_heads: 1, "
                            "tie_embeddings: true, mlp: moe}"}) {
    auto s = spec::ParseJobSpec(std::string("model: ") + model);
    REQUIRE(s.ok());
    INFO(model);
    REQUIRE(EstimateMemory(*s, 1).params == ModelParams(*s));
  }
}

TEST_CASE("state shards over ranks; a model that cannot fit is refused with the estimate") {
  auto big = spec::ParseJobSpec(
      "model: {n_layers: 48, d_model: 8192, n_heads: 64}\nbatch_size: 8\n"
      "parallelism: {world_size: 4}\n");
  REQUIRE(big.ok());
  const MemoryEstimate one = EstimateMemory(*big, 1), four = EstimateMemory(*big, 4);
  REQUIRE(one.params > 38'000'000'000LL);  // ~38.7 B parameters (12 d^2 per layer)
  REQUIRE(four.state_bytes * 4 >= one.state_bytes);
  REQUIRE(four.state_bytes < one.state_bytes / 3);
  REQUIRE(one.state_bytes == 16 * one.params);  // fp32 weights, gradients, AdamW m and v
  const std::vector<jobs::v1::Node> nodes = {Node("a", 2, 16LL << 30), Node("b", 2, 16LL << 30)};
  absl::Status s = CheckMemoryFits(*big, 4, "cpu", nodes);
  INFO(s.message());
  REQUIRE(absl::IsFailedPrecondition(s));
  REQUIRE(absl::StrContains(s.message(), "per rank"));
  REQUIRE(absl::StrContains(s.message(), "for the 2 ranks a node runs"));
  REQUIRE(absl::StrContains(s.message(), "the largest node has 16.0 GiB"));
  auto tiny = spec::ParseJobSpec("model: {n_layers: 1, d_model: 32, n_heads: 2}\n");
  REQUIRE(tiny.ok());
  REQUIRE(CheckMemoryFits(*tiny, 4, "cpu", nodes).ok());
  REQUIRE(EstimateMemory(*tiny, 4).per_rank() < (64 << 20));
  REQUIRE(CheckMemoryFits(*big, 4, "cpu", {}).ok());  // nothing to compare with
}

}  // namespace
}  // namespace ember::daemon
