#include "runtime/model/gpt_cuda_plan.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

namespace ember::model {
namespace {

// Every (offset, size) slot is aligned, lies inside [0, total) and overlaps no other.
void CheckSlots(std::vector<std::pair<int64_t, int64_t>> slots, int64_t total) {
  std::sort(slots.begin(), slots.end());
  int64_t end = 0;
  for (const auto& [off, size] : slots) {
    INFO("slot at " << off << " of " << size);
    CHECK(off % kGptCudaAlignFloats == 0);
    CHECK(size > 0);
    CHECK(off >= end);
    end = off + size;
  }
  CHECK(end <= total);
  // No slack beyond each slot's rounding: the arena is as small as the alignment allows.
  int64_t rounded = 0;
  for (const auto& s : slots) rounded += (s.second + kGptCudaAlignFloats - 1) / kGptCudaAlignFloats;
  CHECK(total == rounded * kGptCudaAlignFloats);
}

TEST_CASE("parameter layout: Gpt's host offsets, aligned device slots") {
  for (GptConfig cfg : {GptConfig{}, LlamaConfig()}) {
    cfg.vocab_size = 250;  // rows that are not a multiple of the alignment
    cfg.d_model = 96;
    cfg.n_head = 3;
    auto model = Gpt::Create(cfg, 7);
    REQUIRE(model.ok());
    const GptCudaParamLayout l = PlanGptCudaParams(cfg);
    REQUIRE(l.offset.size() == (*model)->specs().size());
    CHECK(l.host_total == (*model)->num_params());
    std::vector<std::pair<int64_t, int64_t>> slots;
    for (size_t i = 0; i < l.offset.size(); ++i) {
      CHECK(l.host_offset[i] == (*model)->param(i) - (*model)->params_flat());
      CHECK(l.numel[i] == (*model)->specs()[i].numel());
      slots.push_back({l.offset[i], l.numel[i]});
    }
    CheckSlots(slots, l.total);
  }
}

TEST_CASE("activation layout: every buffer its own aligned slot of the right size") {
  GptConfig cfg;
  cfg.n_layer = 3;
  cfg.n_head = 4;
  cfg.n_kv_head = 0;
  for (auto mlp : {GptConfig::Mlp::kGelu, GptConfig::Mlp::kSwiGlu}) {
    cfg.mlp = mlp;
    const int64_t B = 3, T = 37, N = B * T, C = cfg.d_model, Q = cfg.qkv_width(), F = cfg.ff();
    const int64_t F1 = mlp == GptConfig::Mlp::kSwiGlu ? 2 * F : F;
    auto l = PlanGptCudaActivations(cfg, B, T);
    REQUIRE(l.ok());
    REQUIRE(l->layers.size() == 3);
    std::vector<std::pair<int64_t, int64_t>> slots;
    for (const GptCudaLayerActs& a : l->layers) {
      for (auto s : {std::pair{a.x, N * C}, {a.ln1, N * C}, {a.rstd1, N}, {a.qkv, N * Q},
                     {a.att, N * C}, {a.lse, B * cfg.n_head * T}, {a.xmid, N * C},
                     {a.ln2, N * C}, {a.rstd2, N}, {a.fc1, N * F1}, {a.act, N * F}})
        slots.push_back(s);
    }
    for (auto s : {std::pair{l->xf, N * C}, {l->lnf, N * C}, {l->rstdf, N}, {l->dlnf, N * C},
                   {l->dx, N * C}, {l->dln, N * C}, {l->tmp, N * C}, {l->datt, N * C},
                   {l->dact, N * F}, {l->dfc1, N * F1}, {l->dqkv, N * Q}, {l->tokens, N},
                   {l->targets, N}, {l->pos, N}})
      slots.push_back(s);
    CheckSlots(slots, l->total);
  }
}

TEST_CASE("activation layout refuses bad batches") {
  GptConfig cfg;
  CHECK(PlanGptCudaActivations(cfg, 1, cfg.context).ok());
  CHECK(PlanGptCudaActivations(cfg, 1, cfg.context + 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(!PlanGptCudaActivations(cfg, 0, 4).ok());
  CHECK(!PlanGptCudaActivations(cfg, 2, 0).ok());
  cfg.n_head = 5;  // does not divide d_model
  CHECK(!PlanGptCudaActivations(cfg, 1, 4).ok());
}

}  // namespace
}  // namespace ember::model
