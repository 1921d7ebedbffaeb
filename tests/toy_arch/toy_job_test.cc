// A job spec naming the toy architecture (`model: {arch: toy}`) trained by real ember-worker
// processes: the ember-worker of this folder registers the toy beside gpt and llama (adding an
// architecture is one folder, docs/adding-a-model.md), and the stock ember-worker, which does not
// have it, refuses the job at start naming the architectures it has.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <string>

#include "runtime/jobspec/spec.h"
#include "runtime/model/from_spec.h"
#include "runtime/store/server.h"
#include "runtime/worker/worker_harness.h"

namespace ember::worker {
namespace {

const char* const kToy =
    "name: toy\n"
    "model: {arch: toy, vocab_size: 256, context_length: 16, n_layers: 2, d_model: 16}\n"
    "data: {text_path: corpus.txt}\n"
    "optimizer: {lr: 0.01, schedule: constant}\n"
    "parallelism: {strategy: fsdp}\n"
    "checkpoint: {every_steps: 10}\n"
    "steps: 30\nbatch_size: 4\nseed: 3\ndeterministic: true\nthreads: 1\n";

void WriteToySpec(const std::string& dir, const std::string& extra = "") {
  std::ofstream f(dir + "/job.yaml");
  f << kToy << extra;
}

TEST_CASE("a job with model.arch: toy trains on 2 FSDP ranks of a worker that registers it") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  WorkerBinary() = "tests/toy_arch/ember-worker-toy";
  const std::string dir = NewJobDir("toy");
  WriteToySpec(dir);
  REQUIRE(RunJob(addr, "toy", dir, 2, 0) == std::vector<int>{0, 0});
  const std::map<int64_t, double> loss = Losses(dir);
  REQUIRE(loss.size() >= 3);
  for (const auto& [step, l] : loss) CHECK(std::isfinite(l));
  // Byte-level tokens from a uniform start: the first loss is near ln(256) = 5.55, and 30 steps
  // of AdamW at lr 0.01 bring it well down (the toy's gradients are checked by toy_arch_test).
  CHECK(std::abs(loss.begin()->second - std::log(256.0)) < 0.5);
  CHECK(loss.rbegin()->second < loss.begin()->second - 0.5);
  // Its checkpoints record the architecture's name.
  std::ifstream meta(dir + "/checkpoints/step-30/metadata.json");
  std::string text((std::istreambuf_iterator<char>(meta)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"toy\"") != std::string::npos);
}

TEST_CASE("spec::Resolve takes a registered architecture's name and refuses another, naming the registered") {
  auto toy = spec::ParseJobSpec(kToy);
  REQUIRE(toy.ok());
  CHECK(spec::Resolve(*toy, spec::Facts{.world_size = 2}).ok());
  spec::JobSpec bert = *toy;
  bert.mutable_model()->set_arch("bert");  // well-formed; only the registry knows
  auto r = spec::Resolve(bert, spec::Facts{.world_size = 2});
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("model.arch: 'bert' is not a registered architecture; registered: ") == 0);
  CHECK(r.status().message().find("toy") != std::string::npos);
  // The toy's own checks run at Resolve (its factory), and on cuda the support matrix refuses it.
  spec::JobSpec zero = *toy;
  zero.mutable_model()->set_d_model(0);
  CHECK_FALSE(spec::Resolve(zero, spec::Facts{.world_size = 2}).ok());
  spec::JobSpec cuda = *toy;
  cuda.mutable_resources()->set_device_type("cuda");
  auto rc = spec::Resolve(cuda, spec::Facts{.world_size = 1});
  CHECK(rc.status().message().find("model.arch: 'toy' on cuda") == 0);
}

TEST_CASE("the stock ember-worker refuses model.arch: toy at start (exit 2), not mid-run") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  WorkerBinary() = "runtime/worker/ember-worker";
  const std::string dir = NewJobDir("stock");
  WriteToySpec(dir);
  CHECK(RunJob((*server)->address(), "stock", dir, 2, 0) == std::vector<int>{2, 2});
  CHECK(Losses(dir).empty());
}

}  // namespace
}  // namespace ember::worker
