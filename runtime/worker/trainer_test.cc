// The spec -> model/optimizer settings of ember-worker (trainer.h). The environment's tests are in
// runtime/job/job_test.cc.
#include "runtime/worker/trainer.h"

#include <catch2/catch.hpp>

namespace ember::worker {
namespace {

// One table of defaults (docs/model.md): what an empty spec trains is exactly the code's
// defaults, GptConfig{}, AdamWOptions{} and LceOptions{}.
TEST_CASE("the job spec's defaults are the model's, the loss's and the optimizer's", "[worker]") {
  spec::JobSpec s;
  s.set_name("d");
  spec::ApplyDefaults(&s);
  REQUIRE(spec::ValidateJobSpec(s).ok());
  auto c = ModelConfig(s);
  REQUIRE(c.ok());
  const model::GptConfig g;
  CHECK(c->vocab_size == g.vocab_size);
  CHECK(c->context == g.context);
  CHECK(c->n_layer == g.n_layer);
  CHECK(c->n_head == g.n_head);
  CHECK(c->d_model == g.d_model);
  CHECK(c->mlp == g.mlp);
  CHECK(c->d_ff == g.d_ff);
  CHECK(c->window == g.window);
  CHECK(c->init_std == g.init_std);
  CHECK(c->norm_eps == g.norm_eps);
  CHECK(c->loss.label_smoothing == g.loss.label_smoothing);
  CHECK(c->loss.z_loss == g.loss.z_loss);
  CHECK(c->loss.ignore_index == g.loss.ignore_index);
  CHECK(c->arch == g.arch);
  CHECK(c->kv_heads() == g.kv_heads());
  CHECK(c->tie_embeddings == g.tie_embeddings);
  // arch: llama defaults are model::LlamaConfig()'s.
  {
    spec::JobSpec l;
    l.set_name("l");
    l.mutable_model()->set_arch("llama");
    spec::ApplyDefaults(&l);
    auto lc = ModelConfig(l);
    REQUIRE(lc.ok());
    const model::GptConfig want = model::LlamaConfig();
    CHECK(lc->arch == want.arch);
    CHECK(lc->mlp == want.mlp);
    CHECK(lc->tie_embeddings == want.tie_embeddings);
    CHECK(lc->kv_heads() == want.kv_heads());
    CHECK(lc->rope_theta == want.rope_theta);
    CHECK(lc->rope_scaling.llama3 == want.rope_scaling.llama3);
    l.mutable_model()->mutable_rope_scaling()->set_type("llama3");
    spec::ApplyDefaults(&l);
    lc = ModelConfig(l);
    REQUIRE(lc.ok());
    const kernels::RopeScaling r;  // Llama 3.1's values
    CHECK(lc->rope_scaling.llama3);
    CHECK(lc->rope_scaling.factor == r.factor);
    CHECK(lc->rope_scaling.low_freq_factor == r.low_freq_factor);
    CHECK(lc->rope_scaling.high_freq_factor == r.high_freq_factor);
    CHECK(lc->rope_scaling.original_max_position == r.original_max_position);
  }
  s.mutable_model()->set_mlp("moe");
  spec::ApplyDefaults(&s);
  c = ModelConfig(s);
  REQUIRE(c.ok());
  CHECK(c->n_expert == g.n_expert);
  CHECK(c->top_k == g.top_k);
  const kernels::AdamWOptions a = AdamWOptionsFor(s), k;
  CHECK(a.lr == k.lr);
  CHECK(a.beta1 == k.beta1);
  CHECK(a.beta2 == k.beta2);
  CHECK(a.eps == k.eps);
  CHECK(a.weight_decay == k.weight_decay);
}

TEST_CASE("learning-rate schedule: warmup, constant, cosine floor", "[worker]") {
  spec::JobSpec s;
  s.set_steps(100);
  s.mutable_optimizer()->set_lr(1.0f);
  s.mutable_optimizer()->set_warmup_steps(10);
  s.mutable_optimizer()->set_schedule("constant");
  s.mutable_optimizer()->set_min_lr_ratio(0.1f);
  CHECK(LearningRate(s, 5) == Approx(0.5));
  CHECK(LearningRate(s, 50) == Approx(1.0));
  s.mutable_optimizer()->set_schedule("cosine");
  CHECK(LearningRate(s, 10) == Approx(1.0));
  CHECK(LearningRate(s, 55) == Approx(0.55));
  CHECK(LearningRate(s, 100) == Approx(0.1));
}

}  // namespace
}  // namespace ember::worker
