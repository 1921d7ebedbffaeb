#include "runtime/worker/env.h"

#include <catch2/catch.hpp>
#include <map>

#include "runtime/worker/trainer.h"

namespace ember::worker {
namespace {

absl::StatusOr<WorkerEnv> Read(const std::map<std::string, std::string>& m) {
  return ReadWorkerEnv([&](const char* n) -> const char* {
    auto it = m.find(n);
    return it == m.end() ? nullptr : it->second.c_str();
  });
}

TEST_CASE("worker environment: required variables, ranges, prefix", "[worker]") {
  std::map<std::string, std::string> m = {{"EMBER_STORE_ADDR", "127.0.0.1:1"}, {"EMBER_JOB_ID", "j1"},
                                          {"EMBER_ATTEMPT", "3"}, {"EMBER_RANK", "1"},
                                          {"EMBER_WORLD_SIZE", "2"}, {"EMBER_JOB_DIR", "/tmp/j1"}};
  auto e = Read(m);
  REQUIRE(e.ok());
  CHECK(e->prefix() == "jobs/j1/attempt/3/");
  CHECK(e->device == "cpu");
  CHECK(e->local_world_size == 2);
  auto bad = [&](const std::string& k, const std::string& v, const std::string& msg) {
    auto c = m;
    if (v.empty()) c.erase(k); else c[k] = v;
    auto r = Read(c);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find(msg) != std::string::npos);
  };
  bad("EMBER_STORE_ADDR", "", "EMBER_STORE_ADDR");
  bad("EMBER_RANK", "2", "EMBER_RANK=2");
  bad("EMBER_WORLD_SIZE", "zero", "EMBER_WORLD_SIZE");
  bad("EMBER_DEVICE", "tpu", "EMBER_DEVICE");
  bad("EMBER_JOB_ID", "a/b", "EMBER_JOB_ID");
  CHECK(!e->tls.enabled());

  auto t = m;
  t["EMBER_TLS_CA"] = "/etc/ember/tls/ca.crt";
  e = Read(t);
  REQUIRE(e.ok());
  CHECK(e->tls.enabled());
  CHECK(e->tls.ca_file == "/etc/ember/tls/ca.crt");
  t["EMBER_TLS_CERT"] = "/etc/ember/tls/node.crt";
  e = Read(t);
  REQUIRE(!e.ok());  // a certificate without its key
  CHECK(std::string(e.status().message()).find("EMBER_TLS_KEY") != std::string::npos);
  t["EMBER_TLS_KEY"] = "/etc/ember/tls/node.key";
  e = Read(t);
  REQUIRE(e.ok());
  CHECK(e->tls.key_file == "/etc/ember/tls/node.key");
}

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
