// Multi-process tests of the real ember-worker binary: an in-process store, loopback only, hard
// timeouts; children are killed if they outlive them.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_layout.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tools.h"
#include "proto/jobs.pb.h"
#include "runtime/job/env.h"
#include "runtime/job/keys.h"
#include "runtime/model/gpt.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/worker/worker_harness.h"

namespace ember::worker {
namespace {

TEST_CASE("1, 2 and 4 worker processes train to the same losses; progress key", "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  std::map<int, std::map<int64_t, double>> losses;
  for (int world : {1, 2, 4}) {
    const std::string dir = NewJobDir(absl::StrCat("w", world));
    WriteSpec(dir, 20, 4 / world);
    for (int c : RunJob(addr, absl::StrCat("w", world), dir, world, 0)) REQUIRE(c == 0);
    losses[world] = Losses(dir);
    REQUIRE(losses[world].size() == 20);
    CHECK(*ckpt::ResolveLatest(dir + "/checkpoints") == dir + "/checkpoints/step-20");
  }
  CHECK(losses[1][20] < 0.8 * losses[1][1]);  // it learns
  for (int world : {2, 4})
    for (const auto& [step, l] : losses[1]) CheckClose(losses[world][step], l, 1e-5);
  auto client = store::Client::Connect({.address = addr});
  REQUIRE(client.ok());
  for (int r = 0; r < 4; ++r) {
    auto v = client->Get(job::keys::Progress("w4", 0, r));
    REQUIRE(v.ok());
    jobs::v1::Progress p;
    REQUIRE(p.ParseFromString(*v));
    CHECK(p.metrics().step() == 20);
    CHECK(p.steps() == 20);
    CHECK(p.metrics().loss() == Approx(losses[4][20]).epsilon(1e-6));  // the global loss, as in the metrics
    CHECK(p.metrics().tokens_per_s() > 0);
    CHECK(p.eta_s() == 0);  // the last step
    CHECK(p.metrics().peak_rss_bytes() > 0);
    CHECK(p.metrics().comm_memory_bytes() > 0);  // 4 ranks on one host: each maps its shm segment
  }
}

TEST_CASE("arch llama trains end to end: loss falls, 2 ranks match 1, checkpoint has lm_head and no wpe",
          "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  std::map<int, std::map<int64_t, double>> losses;
  for (int world : {1, 2}) {
    const std::string id = absl::StrCat("llama", world), dir = NewJobDir(id);
    std::ofstream(dir + "/job.yaml")
        << "name: t\n"
           "model: {arch: llama, vocab_size: 256, context_length: 32, n_layers: 2, n_heads: 4, "
           "n_kv_heads: 2, d_model: 32, rope_scaling: {type: llama3, factor: 4, original_max_position: 16}}\n"
           "data: {text_path: corpus.txt}\n"
           "optimizer: {lr: 0.003, schedule: constant, grad_clip: 1.0}\n"
           "checkpoint: {every_steps: 12}\n"
        << "steps: 12\nbatch_size: " << 4 / world << "\nseed: 7\ndeterministic: true\nthreads: 1\n";
    for (int c : RunJob((*server)->address(), id, dir, world, 0)) REQUIRE(c == 0);
    losses[world] = Losses(dir);
    REQUIRE(losses[world].size() == 12);
    auto reader = ckpt::CheckpointReader::Open(dir + "/checkpoints");
    REQUIRE(reader.ok());
    auto head = (*reader)->ReadFull("lm_head.weight");
    REQUIRE(head.ok());
    CHECK(head->size() == 256 * 32 * 4);
    auto qkv = (*reader)->ReadFull("blocks.1.attn.qkv.weight");
    REQUIRE(qkv.ok());
    CHECK(qkv->size() == (4 + 2 * 2) * 8 * 32 * 4);
    CHECK(!(*reader)->ReadFull("wpe.weight").ok());
  }
  CHECK(losses[1][12] < 0.8 * losses[1][1]);
  for (const auto& [step, l] : losses[1]) CheckClose(losses[2][step], l, 1e-5);
}

TEST_CASE("resume from latest at another world size continues the same run", "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  const std::string ref = NewJobDir("ref"), dir = NewJobDir("resume");
  WriteSpec(ref, 16, 2);
  for (int c : RunJob(addr, "ref", ref, 2, 0)) REQUIRE(c == 0);
  // Attempt 0 stops after 8 steps (checkpoints at 5 and 8); attempt 1 resumes at 4 ranks.
  WriteSpec(dir, 8, 2);
  for (int c : RunJob(addr, "resume", dir, 2, 0)) REQUIRE(c == 0);
  CHECK(ckpt::ListSteps(dir + "/checkpoints") == std::vector<int64_t>{5, 8});
  WriteSpec(dir, 16, 1);
  for (int c : RunJob(addr, "resume", dir, 4, 1)) REQUIRE(c == 0);
  auto a = Losses(ref), b = Losses(dir);
  REQUIRE(b.size() == 16);
  for (int64_t s = 1; s <= 16; ++s) CheckClose(b[s], a[s], 1e-5);
  auto reader = ckpt::CheckpointReader::Open(dir + "/checkpoints");
  REQUIRE(reader.ok());
  CHECK((*reader)->metadata().step == 16);
  CHECK((*reader)->metadata().world_size == 4);
}

// Issue 12: a garbage `latest` made the worker start from step 0 and then overwrite and rotate the
// good checkpoints away. It must resume from the newest checkpoint that verifies.
TEST_CASE("a garbage latest resumes from the newest good checkpoint, not from step 0", "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  const std::string dir = NewJobDir("garbage_latest");
  WriteSpec(dir, 8, 2, "", "checkpoint: {every_steps: 5, keep_last: 1}\n");
  REQUIRE(RunJob(addr, "gl", dir, 1, 0) == std::vector<int>{0});
  REQUIRE(ckpt::ListSteps(dir + "/checkpoints") == std::vector<int64_t>{8});
  std::ofstream(dir + "/checkpoints/latest", std::ios::trunc) << "\x01garbage";
  WriteSpec(dir, 12, 2, "", "checkpoint: {every_steps: 5, keep_last: 1}\n");
  REQUIRE(RunJob(addr, "gl", dir, 1, 1) == std::vector<int>{0});
  // Resumed at 8: the second run logged steps 9..12 only (12 lines in all, not 8 + 12).
  std::ifstream f(dir + "/metrics/rank-0.jsonl");
  int lines = 0;
  for (std::string l; std::getline(f, l);) ++lines;
  CHECK(lines == 12);
  CHECK(*ckpt::ResolveLatest(dir + "/checkpoints") == dir + "/checkpoints/step-12");
}

// A pipeline job spec (or, with stages 0, the unpipelined reference on the same data: one rank,
// one batch of micro_batches x batch_size sequences per step).
// The spec lines every pipeline test job shares (no parallelism or batch yet).
void WriteModelSpec(std::ofstream& f, int64_t steps, int layers, double grad_clip = 0) {
  f << "name: t\nmodel: {vocab_size: 256, context_length: 32, n_layers: " << layers
    << ", n_heads: 2, d_model: 32}\n"
       "data: {text_path: corpus.txt}\n"
       "optimizer: {lr: 0.003, schedule: constant, weight_decay: 0.1"
    << (grad_clip > 0 ? absl::StrCat(", grad_clip: ", grad_clip) : "") << "}\n"
       "checkpoint: {every_steps: 5}\n"
    << "steps: " << steps << "\nseed: 7\ndeterministic: true\nthreads: 1\n";
}

void WritePipelineSpec(const std::string& dir, int64_t steps, int stages, const std::string& schedule,
                       int micro_batches, int layers = 2, bool preallocate = false) {
  std::ofstream f(dir + "/job.yaml");
  WriteModelSpec(f, steps, layers);
  if (stages > 1) {
    f << "batch_size: 1\nparallelism: {strategy: pipeline, pipeline_stages: " << stages
      << ", pipeline_schedule: " << schedule << ", pipeline_micro_batches: " << micro_batches
      << (preallocate ? ", pipeline_preallocate: true" : "") << "}\n";
  } else {
    f << "batch_size: " << micro_batches << "\nparallelism: {strategy: none}\n";
  }
}

TEST_CASE("2-stage pipeline workers (1F1B, ZB-H1, interleaved, GPipe) give the unpipelined losses; resume",
          "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  const std::string ref = NewJobDir("pp-ref");
  WritePipelineSpec(ref, 12, 0, "", 4);
  REQUIRE(RunJob(addr, "pp-ref", ref, 1, 0) == std::vector<int>{0});
  const std::map<int64_t, double> want = Losses(ref);
  REQUIRE(want.size() == 12);
  REQUIRE(want.at(12) < 0.9 * want.at(1));  // it learns, so a wrong update would show
  for (const std::string schedule : {"1f1b", "zbh1"}) {
    INFO(schedule);
    const std::string id = "pp-" + schedule, dir = NewJobDir(id);
    WritePipelineSpec(dir, 10, 2, schedule, 4);
    REQUIRE(RunJob(addr, id, dir, 2, 0) == std::vector<int>{0, 0});
    std::map<int64_t, double> got = Losses(dir);
    REQUIRE(got.size() == 10);
    for (const auto& [step, l] : got) CheckClose(l, want.at(step), 1e-5);
    auto client = store::Client::Connect({.address = addr});
    REQUIRE(client.ok());
    for (int r = 0; r < 2; ++r) {  // progress from both stages, with the global loss
      auto v = client->Get(job::keys::Progress(id, 0, r));
      REQUIRE(v.ok());
      jobs::v1::Progress p;
      REQUIRE(p.ParseFromString(*v));
      CHECK(p.metrics().step() == 10);
      CHECK(p.metrics().loss() == Approx(got.at(10)).epsilon(1e-6));
    }
    CHECK(*ckpt::ResolveLatest(dir + "/checkpoints") == dir + "/checkpoints/step-10");
    // The step-10 checkpoint resumes in another schedule (1F1B -> GPipe, with preallocated
    // receive buffers) or unpipelined on one rank (ZB-H1 -> none) and continues the reference run.
    if (schedule == std::string("1f1b")) {
      WritePipelineSpec(dir, 12, 2, "gpipe", 4, 2, /*preallocate=*/true);
      REQUIRE(RunJob(addr, id, dir, 2, 1) == std::vector<int>{0, 0});
    } else {
      WritePipelineSpec(dir, 12, 0, "", 4);
      REQUIRE(RunJob(addr, id, dir, 1, 1) == std::vector<int>{0});
    }
    got = Losses(dir);
    REQUIRE(got.size() == 12);
    for (int64_t step : {11, 12}) CheckClose(got.at(step), want.at(step), 1e-5);
  }
  // Interleaved 1F1B: 4 model stages (of one block each) on the 2 ranks, and GPipe.
  const std::string ref4 = NewJobDir("pp-ref4");
  WritePipelineSpec(ref4, 6, 0, "", 4, 4);
  REQUIRE(RunJob(addr, "pp-ref4", ref4, 1, 0) == std::vector<int>{0});
  const std::map<int64_t, double> want4 = Losses(ref4);
  REQUIRE(want4.size() == 6);
  for (const std::string schedule : {"interleaved_1f1b", "gpipe"}) {
    INFO(schedule);
    const std::string id = "pp4-" + schedule, dir = NewJobDir(id);
    WritePipelineSpec(dir, 6, 2, schedule, 4, 4);
    REQUIRE(RunJob(addr, id, dir, 2, 0) == std::vector<int>{0, 0});
    const std::map<int64_t, double> got = Losses(dir);
    REQUIRE(got.size() == 6);
    for (const auto& [step, l] : got) CheckClose(l, want4.at(step), 1e-5);
  }
}

// A 4-layer job on `world` ranks: `stages` >= 2 pipeline stages (1F1B, each FSDP-sharded over
// world / stages ranks, micro-batches of one sequence making a global batch of 4), or FSDP over
// `world` ranks (stages 0; batch 4 / world).
// With gradient clipping, so every layout reports the global gradient norm (the check that AdamW's
// invariance to a constant gradient scale would otherwise hide from the losses).
void WriteLayoutSpec(const std::string& dir, int64_t steps, int stages, int world) {
  std::ofstream f(dir + "/job.yaml");
  WriteModelSpec(f, steps, 4, /*grad_clip=*/0.5);
  if (stages > 1) {
    f << "batch_size: 1\nparallelism: {strategy: pipeline, pipeline_stages: " << stages
      << ", pipeline_micro_batches: " << 4 / (world / stages) << ", world_size: " << world << "}\n";
  } else {
    f << "batch_size: " << 4 / world << "\nparallelism: {strategy: " << (world > 1 ? "fsdp" : "none")
      << "}\n";
  }
}

void CopyTree(const std::string& from, const std::string& to) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
}

// A pipeline job initialised from weights (checkpoint.init_from_safetensors on gpt, checkpoint.init_from
// a Hugging Face directory on llama): each stage loads its own parameters (with a tied head, the
// embedding in both end stages), so its losses are the unpipelined job's from the same weights, and
// not those of the seed's init.
TEST_CASE("a 2-stage pipeline initialised from safetensors or Hugging Face gives the unpipelined losses",
          "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  struct Case {
    std::string name, model, init;
  };
  const Case cases[] = {
      {"st", "model: {vocab_size: 256, context_length: 32, n_layers: 2, n_heads: 2, d_model: 32}\n",
       "init_from_safetensors: w.safetensors"},
      {"hf", "model: {arch: llama, vocab_size: 256, context_length: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
             "d_model: 32}\n",
       "init_from: hf"}};
  for (const Case& c : cases) {
    INFO(c.name);
    auto spec = [&](const std::string& dir, int stages, int64_t steps, const std::string& init) {
      std::ofstream f(dir + "/job.yaml");
      f << "name: t\n" << c.model
        << "data: {text_path: corpus.txt}\n"
           "optimizer: {lr: 0.003, schedule: constant, weight_decay: 0.1}\n"
           "checkpoint: {every_steps: 5"
        << (init.empty() ? "" : ", ") << init << "}\nsteps: " << steps << "\nseed: 7\ndeterministic: true\nthreads: 1\n";
      if (stages > 1) {
        f << "batch_size: 1\nparallelism: {strategy: pipeline, pipeline_stages: " << stages
          << ", pipeline_schedule: 1f1b, pipeline_micro_batches: 4}\n";
      } else {
        f << "batch_size: 4\nparallelism: {strategy: none}\n";
      }
    };
    // The weights: 3 steps from the seed's init, exported.
    const std::string a = NewJobDir("ppinit-a-" + c.name);
    spec(a, 1, 3, "");
    REQUIRE(RunJob(addr, "ppinit-a-" + c.name, a, 1, 0) == std::vector<int>{0});
    const std::string ref = NewJobDir("ppinit-ref-" + c.name), pp = NewJobDir("ppinit-pp-" + c.name),
                      fresh = NewJobDir("ppinit-fresh-" + c.name);
    for (const std::string& d : {ref, pp}) {
      if (c.name == "st") {
        REQUIRE(ckpt::ExportSafetensors(a + "/checkpoints", d + "/w.safetensors").ok());
      } else {
        auto st = ckpt::ExportHf(a + "/checkpoints", d + "/hf", {});
        INFO(st.status());
        REQUIRE(st.ok());
      }
    }
    spec(ref, 1, 6, c.init);
    spec(pp, 2, 6, c.init);
    spec(fresh, 2, 6, "");
    REQUIRE(RunJob(addr, "ppinit-ref-" + c.name, ref, 1, 0) == std::vector<int>{0});
    REQUIRE(RunJob(addr, "ppinit-pp-" + c.name, pp, 2, 0) == std::vector<int>{0, 0});
    REQUIRE(RunJob(addr, "ppinit-fresh-" + c.name, fresh, 2, 0) == std::vector<int>{0, 0});
    const std::map<int64_t, double> want = Losses(ref), got = Losses(pp), seed_init = Losses(fresh);
    REQUIRE(want.size() == 6);
    REQUIRE(got.size() == 6);
    for (const auto& [step, l] : got) CheckClose(l, want.at(step), 1e-5);
    // The weights changed the start: a pipeline that ignored them would give the seed-init losses.
    CHECK(std::abs(got.at(1) - seed_init.at(1)) > 1e-3 * std::abs(seed_init.at(1)));
  }
}

// PP x HSDP: each stage's rows sharded within a shard group of dp_shard ranks and the gradient
// shards all-reduced across dp_replicate such groups. PP=2 x (2 replicas x 2 shards) on 8 ranks,
// and PP=2 x (2 replicas x 1 shard) on 4 (whole stage parameters per replica), both give the
// unpipelined losses with gradient clipping on (one global norm over stages and shards, replicas
// not counted twice); the 8-rank checkpoint (every row saved once) resumes as FSDP=4.
TEST_CASE("PP=2 x HSDP workers give the unpipelined losses with clipping; the checkpoint resumes as FSDP=4",
          "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  auto spec = [](const std::string& dir, int64_t steps, int stages, int world, int replicate) {
    std::ofstream f(dir + "/job.yaml");
    f << "name: t\nmodel: {vocab_size: 256, context_length: 32, n_layers: 4, n_heads: 2, d_model: 32}\n"
         "data: {text_path: corpus.txt}\n"
         "optimizer: {lr: 0.003, schedule: constant, weight_decay: 0.1, grad_clip: 0.5}\n"
         "checkpoint: {every_steps: 5}\n"
      << "steps: " << steps << "\nseed: 7\ndeterministic: true\nthreads: 1\n";
    if (stages > 1) {
      f << "batch_size: 1\nparallelism: {strategy: pipeline, pipeline_stages: " << stages
        << ", pipeline_micro_batches: " << 8 / (world / stages) << ", world_size: " << world
        << ", dp_replicate: " << replicate << "}\n";
    } else {  // the same 8 sequences per step
      f << "batch_size: " << 8 / world << "\nparallelism: {strategy: " << (world > 1 ? "fsdp" : "none") << "}\n";
    }
  };
  const std::string ref = NewJobDir("pph-ref");
  spec(ref, 12, 0, 1, 1);
  REQUIRE(RunJob(addr, "pph-ref", ref, 1, 0) == std::vector<int>{0});
  const std::map<int64_t, double> want = Losses(ref), want_norm = Series(ref, "grad_norm");
  REQUIRE(want.size() == 12);
  for (const int world : {8, 4}) {
    INFO("PP=2 x dp_replicate 2 x dp_shard " << world / 4);
    const std::string id = absl::StrCat("pph", world), dir = NewJobDir(id);
    spec(dir, 10, 2, world, 2);
    REQUIRE(RunJob(addr, id, dir, world, 0) == std::vector<int>(world, 0));
    const std::map<int64_t, double> got = Losses(dir);
    REQUIRE(got.size() == 10);
    for (const auto& [step, l] : got) CheckClose(l, want.at(step), 1e-5);
    // The global gradient norm too: AdamW with clipping hides a gradient scaled by a constant
    // (a wrong averaging divisor) from the losses, not from the norm.
    const std::map<int64_t, double> norm = Series(dir, "grad_norm");
    for (const auto& [step, n] : norm) CheckClose(n, want_norm.at(step), 1e-5);
    if (world != 8) continue;
    auto reader = ckpt::CheckpointReader::Open(dir + "/checkpoints");
    REQUIRE(reader.ok());
    CHECK((*reader)->metadata().parallelism.at("pipeline") ==
          "stages=2,ranks=2,schedule=1f1b,micro_batches=2,fsdp=2,dp_replicate=2");
    const std::string to = NewJobDir("pph-fsdp4");
    CopyTree(dir + "/checkpoints", to + "/checkpoints");
    CopyTree(dir + "/metrics", to + "/metrics");
    spec(to, 12, 0, 4, 1);
    REQUIRE(RunJob(addr, "pph-fsdp4", to, 4, 1) == std::vector<int>{0, 0, 0, 0});
    const std::map<int64_t, double> resumed = Losses(to);
    REQUIRE(resumed.size() == 12);
    for (int64_t step : {11, 12}) CheckClose(resumed.at(step), want.at(step), 1e-5);
  }
}

TEST_CASE("PP=2 x FSDP=2 workers give the unpipelined losses and norms with clipping; the checkpoint resumes as FSDP=4 and PP=4",
          "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  const std::string ref = NewJobDir("ppf-ref");
  WriteLayoutSpec(ref, 12, 0, 1);
  REQUIRE(RunJob(addr, "ppf-ref", ref, 1, 0) == std::vector<int>{0});
  const std::map<int64_t, double> want = Losses(ref);
  REQUIRE(want.size() == 12);
  REQUIRE(want.at(12) < 0.9 * want.at(1));
  // Attempt 0: PP=2 x FSDP=2 for 10 steps (checkpoints at 5 and 10).
  const std::string dir = NewJobDir("ppf");
  WriteLayoutSpec(dir, 10, 2, 4);
  REQUIRE(RunJob(addr, "ppf", dir, 4, 0) == std::vector<int>{0, 0, 0, 0});
  std::map<int64_t, double> got = Losses(dir);
  REQUIRE(got.size() == 10);
  for (const auto& [step, l] : got) CheckClose(l, want.at(step), 1e-5);
  const std::map<int64_t, double> want_norm = Series(ref, "grad_norm");
  for (const auto& [step, n] : Series(dir, "grad_norm")) CheckClose(n, want_norm.at(step), 1e-5);
  {  // Saved with global names, full shapes and each FSDP rank's chunk of the rows.
    auto reader = ckpt::CheckpointReader::Open(dir + "/checkpoints");
    REQUIRE(reader.ok());
    const ckpt::Metadata& meta = (*reader)->metadata();
    CHECK(meta.step == 10);
    CHECK(meta.world_size == 4);
    CHECK(meta.parallelism.at("pipeline") == "stages=2,ranks=2,schedule=1f1b,micro_batches=2,fsdp=2");
    const ckpt::TensorMeta* t = meta.Find("blocks.3.attn.qkv.weight");
    REQUIRE(t != nullptr);
    CHECK(t->shape[0] == 96);
    for (const char* name : {"wte.weight", "wpe.weight", "ln_f.weight", "optim.wte.weight.exp_avg"}) {
      INFO(name);
      CHECK(meta.Find(name) != nullptr);
    }
  }
  // Attempt 1, from copies of that job directory: FSDP=4 and PP=4 (one stage per rank).
  for (int stages : {0, 4}) {
    INFO("resume with " << (stages ? "PP=4" : "FSDP=4"));
    const std::string id = absl::StrCat("ppf-", stages), to = NewJobDir(id);
    CopyTree(dir + "/checkpoints", to + "/checkpoints");
    CopyTree(dir + "/metrics", to + "/metrics");
    WriteLayoutSpec(to, 12, stages, 4);
    REQUIRE(RunJob(addr, id, to, 4, 1) == std::vector<int>{0, 0, 0, 0});
    got = Losses(to);
    REQUIRE(got.size() == 12);
    for (int64_t step : {11, 12}) CheckClose(got.at(step), want.at(step), 1e-5);
  }
}

TEST_CASE("workers of an attempt older than the job's fence write nothing and exit 1", "[worker][fencing]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  auto client = store::Client::Connect({.address = (*server)->address()});
  REQUIRE(client.ok());
  const std::string dir = NewJobDir("fenced");
  WriteSpec(dir, 4, 2);
  REQUIRE(client->Set(job::keys::Fence("fenced"), "1").ok());  // attempt 1 has started
  const absl::Time t0 = absl::Now();
  CHECK(RunJob((*server)->address(), "fenced", dir, 2, 0) == std::vector<int>{1, 1});
  CHECK(absl::Now() - t0 < absl::Seconds(30));
  // Nothing under attempt 0 (no rendezvous, progress or exit record), no checkpoint, no metrics.
  auto keys = client->ListKeys(job::keys::AttemptPrefix("fenced", 0));
  REQUIRE(keys.ok());
  CHECK(keys->empty());
  CHECK(ckpt::ListSteps(dir + "/checkpoints").empty());
  CHECK(Losses(dir).empty());
  // The attempt that owns the job is not affected.
  for (int c : RunJob((*server)->address(), "fenced", dir, 2, 1)) CHECK(c == 0);
  CHECK(Losses(dir).size() == 4);
}

TEST_CASE("bad spec or environment exits 2 before training", "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string dir = NewJobDir("bad");
  WriteSpec(dir, 2, 1, "parallelism: {strategy: pipeline}\n");  // no stages
  CHECK(RunJob((*server)->address(), "bad", dir, 1, 0) == std::vector<int>{2});
  // A 2-stage pipeline on 1 rank.
  WriteSpec(dir, 2, 1, "parallelism: {strategy: pipeline, pipeline_stages: 2}\n");
  CHECK(RunJob((*server)->address(), "bad", dir, 1, 0) == std::vector<int>{2});
  WriteSpec(dir, 2, 1, "precision: {param_dtype: f8}\n");
  CHECK(RunJob((*server)->address(), "bad", dir, 1, 0) == std::vector<int>{2});
  // An override pattern that matches no parameter (norms are ln1/ln2/ln_f, not "norm").
  WriteSpec(dir, 2, 1, "precision: {param_dtype: bf16, overrides: [{pattern: \"*norm*\", param_dtype: f32}]}\n");
  CHECK(RunJob((*server)->address(), "bad", dir, 1, 0) == std::vector<int>{2});
  std::ofstream(dir + "/job.yaml") << "name: t\ndata: {path: missing.bin}\n";
  CHECK(RunJob((*server)->address(), "bad", dir, 1, 0) == std::vector<int>{2});
  pid_t pid = Spawn({{job::kEnvJobDir, dir}, {job::kEnvStoreAddr, ""}});
  CHECK(WaitAll({pid}, absl::Seconds(30)) == std::vector<int>{2});
}

}  // namespace
}  // namespace ember::worker

namespace ember::worker {
namespace {

TEST_CASE("checkpoint.init_from_safetensors loads the weights before the first step", "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  // A: 3 steps from the seed's init; its final checkpoint exported as safetensors.
  const std::string a = NewJobDir("init_a");
  WriteSpec(a, 3, 2);
  REQUIRE(RunJob(addr, "init-a", a, 1, 0) == std::vector<int>{0});
  const std::string trained = a + "/trained.safetensors";
  REQUIRE(ckpt::ExportSafetensors(a + "/checkpoints", trained).ok());
  // The same weights with a zero token embedding: with the tied head every logit is exactly 0, so
  // the first loss must be ln(256) whatever the other weights are (an independent reference).
  auto file = ckpt::SafetensorsFile::Open(trained);
  REQUIRE(file.ok());
  std::vector<ckpt::TensorSpec> specs;
  std::vector<std::string> bytes;
  for (const auto& t : (*file)->tensors()) {
    specs.push_back({t.name, t.dtype, t.shape});
    std::string b((*file)->Data(t));
    if (t.name == "wte.weight") b.assign(b.size(), '\0');
    bytes.push_back(std::move(b));
  }
  std::vector<absl::string_view> views(bytes.begin(), bytes.end());
  const std::string zeroed = a + "/zero_wte.safetensors";
  REQUIRE(ckpt::WriteSafetensors(zeroed, specs, views).ok());

  const std::string b = NewJobDir("init_b");
  WriteSpec(b, 1, 2, "", "checkpoint: {every_steps: 5, init_from_safetensors: w.safetensors}\n");
  std::rename(trained.c_str(), (b + "/w.safetensors").c_str());
  REQUIRE(RunJob(addr, "init-b", b, 1, 0) == std::vector<int>{0});
  const std::string z = NewJobDir("init_z");
  WriteSpec(z, 1, 2, "", "checkpoint: {every_steps: 5, init_from_safetensors: w.safetensors}\n");
  std::rename(zeroed.c_str(), (z + "/w.safetensors").c_str());
  REQUIRE(RunJob(addr, "init-z", z, 1, 0) == std::vector<int>{0});

  const double first_a = Losses(a).at(1), first_b = Losses(b).at(1), first_z = Losses(z).at(1);
  INFO("fresh init " << first_a << ", trained weights " << first_b << ", zero embedding " << first_z);
  CHECK(std::abs(first_z - std::log(256.0)) < 1e-4);
  CHECK(first_b < first_a);  // the same first batch, seen with weights trained for 3 steps

  // A missing tensor is an error naming it, before any training.
  const std::string m = NewJobDir("init_missing");
  WriteSpec(m, 1, 2, "", "checkpoint: {every_steps: 5, init_from_safetensors: w.safetensors}\n");
  REQUIRE(ckpt::WriteSafetensors(m + "/w.safetensors", {specs[0]}, {views[0]}).ok());
  std::vector<int> codes = RunJob(addr, "init-m", m, 1, 0);
  REQUIRE(codes.size() == 1);
  CHECK(codes[0] != 0);
}

}  // namespace
}  // namespace ember::worker

namespace ember::worker {
namespace {

// loss.label_smoothing, loss.z_loss, loss.ignore_index and model.norm_eps take effect in the real
// worker. The weights make the loss computable by hand: every block weight is 0 (attention and MLP
// add nothing), wpe = 0, norms = 1 and wte row j = a_j * (1, ..., 1). So the final hidden state of
// token t is s_t * (1, ..., 1) with s_t = a_t / sqrt(a_t^2 + norm_eps), the logits are
// z_j = C * a_j * s_t, and (docs/model.md, kernels/cross_entropy.h)
//   loss = lse - (1 - eps) z_y - (eps / V) sum_j z_j + zc * lse^2,  lse = log sum_j exp z_j.
// The corpus alternates 'a' and 'b', so with an even T every sequence has T/2 (a -> b) and T/2
// (b -> a) pairs whatever its offset, and the mean loss is their average; with ignore_index 'b'
// only the (b -> a) pairs count.
TEST_CASE("loss and norm settings of the spec change the first loss as the formula says", "[worker]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const int64_t V = 256, C = 32, T = 32;
  model::GptConfig cfg;
  cfg.vocab_size = V;
  cfg.context = T;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.d_model = C;
  std::vector<double> a(V);
  for (int64_t j = 0; j < V; ++j) a[j] = 0.05 * std::sin(0.7 * j + 0.3);
  a['a'] = 0.004;  // a^2 = 1.6e-5: norm_eps 1e-5 vs 1e-3 matters
  a['b'] = -0.03;
  std::vector<ckpt::TensorSpec> specs;
  std::vector<std::string> bytes;
  for (const model::ParamSpec& p : model::ParamSpecs(cfg)) {
    std::vector<float> w(p.numel(), 0.0f);
    if (p.init_std == 0) std::fill(w.begin(), w.end(), 1.0f);  // the norms
    if (p.name == "wte.weight")
      for (int64_t j = 0; j < V; ++j) std::fill(w.begin() + j * C, w.begin() + (j + 1) * C, float(a[j]));
    specs.push_back({p.name, ckpt::DType::kF32, p.shape});
    bytes.emplace_back(reinterpret_cast<const char*>(w.data()), w.size() * 4);
  }
  std::vector<absl::string_view> views(bytes.begin(), bytes.end());

  // Reference loss of the pair (t -> y).
  auto pair_loss = [&](int t, int y, double eps_ls, double zc, double norm_eps) {
    const double s = float(a[t]) / std::sqrt(double(float(a[t])) * float(a[t]) + norm_eps);
    std::vector<double> z(V);
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, z[j] = C * double(float(a[j])) * s);
    double se = 0;
    for (int64_t j = 0; j < V; ++j) se += std::exp(z[j] - mx), sum += z[j];
    const double lse = mx + std::log(se);
    return lse - (1 - eps_ls) * z[y] - eps_ls / V * sum + zc * lse * lse;
  };
  struct Case {
    std::string yaml;
    double want;
  };
  const double n5 = 1e-5;
  const Case cases[] = {
      {"", (pair_loss('a', 'b', 0, 0, n5) + pair_loss('b', 'a', 0, 0, n5)) / 2},
      {"loss: {label_smoothing: 0.2}\n",
       (pair_loss('a', 'b', 0.2, 0, n5) + pair_loss('b', 'a', 0.2, 0, n5)) / 2},
      {"loss: {z_loss: 0.01}\n",
       (pair_loss('a', 'b', 0, 0.01, n5) + pair_loss('b', 'a', 0, 0.01, n5)) / 2},
      {"loss: {ignore_index: 98}\n", pair_loss('b', 'a', 0, 0, n5)},
      {"model: {vocab_size: 256, context_length: 32, n_layers: 1, n_heads: 2, d_model: 32, "
       "norm_eps: 0.001}\n",
       (pair_loss('a', 'b', 0, 0, 1e-3) + pair_loss('b', 'a', 0, 0, 1e-3)) / 2},
  };
  int i = 0;
  for (const Case& k : cases) {
    const std::string dir = NewJobDir(absl::StrCat("lossopt", i));
    std::string corpus;
    for (int n = 0; n < 4096; ++n) corpus += "ab";
    std::ofstream(dir + "/corpus.txt") << corpus;
    REQUIRE(ckpt::WriteSafetensors(dir + "/w.safetensors", specs, views).ok());
    const bool own_model = k.yaml.rfind("model:", 0) == 0;
    std::ofstream(dir + "/job.yaml")
        << "name: t\n"
        << (own_model ? k.yaml
                      : "model: {vocab_size: 256, context_length: 32, n_layers: 1, n_heads: 2, d_model: 32}\n" + k.yaml)
        << "data: {text_path: corpus.txt}\n"
           "checkpoint: {init_from_safetensors: w.safetensors}\n"
           "steps: 1\nbatch_size: 2\nseed: 3\ndeterministic: true\nthreads: 1\n";
    REQUIRE(RunJob((*server)->address(), absl::StrCat("lossopt", i), dir, 1, 0) == std::vector<int>{0});
    const double got = Losses(dir).at(1);
    INFO(k.yaml << "loss " << got << ", formula " << k.want);
    CHECK(std::abs(got - k.want) <= 2e-6 * k.want);
    if (i > 0) CHECK(std::abs(k.want - cases[0].want) > 1e-3);  // the setting matters here
    ++i;
  }
}

}  // namespace
}  // namespace ember::worker
