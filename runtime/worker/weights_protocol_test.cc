#include "runtime/worker/weights_protocol.h"

#include <catch2/catch.hpp>

namespace ember::worker {
namespace {

TEST_CASE("weights manifest round trip; offsets; malformed manifests refused", "[weights]") {
  WeightsManifest m;
  m.attempt = 3;
  m.world = 2;
  m.tensors = {{"wte.weight", {256, 32}}, {"ln_f.weight", {32}}, {"empty", {0, 4}}};
  auto p = ParseManifest(EncodeManifest(m));
  REQUIRE(p.ok());
  CHECK(p->attempt == 3);
  CHECK(p->world == 2);
  REQUIRE(p->tensors.size() == 3);
  CHECK(p->tensors[1].name == "ln_f.weight");
  CHECK(p->tensors[0].shape == std::vector<int64_t>{256, 32});
  CHECK(p->tensors[1].offset == 256 * 32 * 4);
  CHECK(p->tensors[1].bytes == 32 * 4);
  CHECK(p->tensors[2].bytes == 0);
  CHECK(p->total_bytes == (256 * 32 + 32) * 4);
  for (const char* bad : {"", "ember-weights v2 attempt=0 world=1\n", "ember-weights v1 attempt=0 world=0\n",
                          "ember-weights v1 attempt=0 world=1\nx F16 3\n", "ember-weights v1 attempt=0 world=1\nx F32 -3\n",
                          "ember-weights v1 attempt=0 world=1\nx F32 1099511627777\n",
                          "ember-weights v1 attempt=0 world=1\nx F32 2097152,1048576\n"}) {
    INFO(bad);
    CHECK(ParseManifest(bad).status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("weights messages and agent names parse back; others are refused", "[weights]") {
  CHECK(ParseMessage(StepMessage(12), "step") == 12);
  CHECK(ParseMessage(AckMessage(7), "ack") == 7);
  CHECK(!ParseMessage(AckMessage(7), "step"));
  CHECK(!ParseMessage("step x", "step"));
  CHECK(!ParseMessage("steps 3", "step"));
  CHECK(ParseRankAgent(RankAgent(5)) == 5);
  CHECK(!ParseRankAgent("sub-1"));
  CHECK(!ParseRankAgent("rank-1"));
}

}  // namespace
}  // namespace ember::worker
