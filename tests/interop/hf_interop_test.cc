// Hugging Face interop end to end (issue 22), with real processes: a SentencePiece model trained
// here on the example corpus tokenizes it (make-tokens), a tiny Llama (GQA, untied head, llama3
// RoPE scaling) trains on it with 2 FSDP ranks, `emberctl ckpt export --format hf` writes the
// Hugging Face directory, and an independent PyTorch LlamaForCausalLM (hf_llama_reference.py,
// written from transformers' code) reading those files gives Ember's logits and loss within 1e-5
// relative; so does Hugging Face transformers' own AutoModelForCausalLM.from_pretrained under torch
// 2.15 (hf_transformers_forward.py, run by the peers venv of deploy/peers-venv.sh: a missing venv
// fails the test, naming the script). Then a job at another world size starts from the export
// (checkpoint.init_from) with lr 0, and its checkpoint exports to the same bytes. Test-only tool: //runtime/worker:llama_logits.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "deploy/peers_venv.h"
#include "absl/strings/str_cat.h"
#include "proto/jobs.pb.h"
#include "runtime/data/token_file.h"
#include "runtime/job/keys.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/worker/worker_harness.h"

#include "testing/subprocess.h"

namespace ember::worker {
namespace {

using ::ember::testing::RunCommand;

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::vector<float> Floats(const std::string& path) {
  const std::string b = Slurp(path);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

void WriteLlamaSpec(const std::string& dir, const std::string& sha, int steps, float lr, const std::string& extra) {
  std::ofstream(dir + "/job.yaml")
      << "name: llama\n"
         "model: {arch: llama, vocab_size: 384, context_length: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2,\n"
         "        d_model: 64, rope_theta: 500000, norm_eps: 1.0e-5,\n"
         "        rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position: 16}}\n"
         "data: {path: tokens.bin, tokenizer: {kind: sentencepiece, sha256: " << sha << "}}\n"
      << "optimizer: {lr: " << lr << ", schedule: constant}\n"
      << "steps: " << steps << "\nbatch_size: 4\nseed: 3\ndeterministic: true\nthreads: 1\n" << extra;
}

// The peers venv's python, with transformers; REQUIREs the venv, naming deploy/peers-venv.sh.
std::string Transformers() {
  INFO(deploy::PeersVenvMissing());
  REQUIRE(deploy::PeersVenvReady());
  return deploy::PeersVenvPython();
}

TEST_CASE("SentencePiece tokens -> tiny Llama -> Hugging Face export matches an independent PyTorch Llama "
          "and transformers' from_pretrained; init_from round trip is bitwise", "[worker][interop]") {
  REQUIRE(std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") == 0);
  Transformers();  // before the training: a missing venv fails at once
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  const std::string dir = NewJobDir("llama");

  // Tokenizer trained here; make-tokens records it.
  REQUIRE(RunCommand({"spm_train", "--input=" + dir + "/corpus.txt", "--model_prefix=" + dir + "/spm", "--vocab_size=384",
               "--model_type=bpe", "--character_coverage=1.0", "--minloglevel=2"}) == 0);
  REQUIRE(RunCommand({Src() + "runtime/data/make-tokens", "--input=" + dir + "/corpus.txt", "--output=" + dir + "/tokens.bin",
               "--tokenizer=sentencepiece", "--spm-model=" + dir + "/spm.model", "--log-level=warn"}) == 0);
  auto tokens = data::TokenFile::Open(dir + "/tokens.bin", data::TokenDtype::kU16);
  REQUIRE(tokens.ok());
  const std::string sha = (*tokens)->tokenizer().sha256;
  REQUIRE(sha.size() == 64);

  WriteLlamaSpec(dir, sha, 30, 0.01f, "checkpoint: {every_steps: 30}\n");
  for (int c : RunJob(addr, "llama", dir, 2, 0)) REQUIRE(c == 0);
  auto losses = Losses(dir);
  REQUIRE(losses.size() == 30);
  CHECK(losses[30] < 0.8 * losses[1]);

  const std::string hf = dir + "/hf";
  REQUIRE(RunCommand({Src() + "launcher/emberctl", "ckpt", "export", dir + "/checkpoints", hf, "--format", "hf"}) == 0);
  const std::string sharded = dir + "/hf_sharded";  // bf16, several files and the index
  REQUIRE(RunCommand({Src() + "launcher/emberctl", "ckpt", "export", dir + "/checkpoints", sharded, "--format", "hf",
               "--max-shard-bytes", "100000", "--dtype", "bf16"}) == 0);

  // A batch of 2 sequences from the token file, the last target ignored.
  const int32_t B = 2, T = 32;
  std::string batch(8 + 8 * B * T, '\0');
  std::memcpy(&batch[0], &B, 4);
  std::memcpy(&batch[4], &T, 4);
  for (int32_t i = 0; i < B * T; ++i) {
    const int64_t at = 1000 + (i / T) * 5000 + i % T;
    int32_t tok = static_cast<int32_t>((*tokens)->at(at)), tgt = static_cast<int32_t>((*tokens)->at(at + 1));
    if (i == B * T - 1) tgt = -100;
    std::memcpy(&batch[8 + 4 * i], &tok, 4);
    std::memcpy(&batch[8 + 4 * (B * T + i)], &tgt, 4);
  }
  std::ofstream(dir + "/batch.bin", std::ios::binary) << batch;

  const std::string tool = Src() + "runtime/worker/llama_logits";
  REQUIRE(RunCommand({tool, "--spec=" + dir + "/job.yaml", "--ckpt=" + dir + "/checkpoints", "--batch=" + dir + "/batch.bin",
               "--out=" + dir + "/ember.bin", "--log-level=warn"}) == 0);
  REQUIRE(RunCommand({tool, "--spec=" + dir + "/job.yaml", "--hf=" + hf, "--batch=" + dir + "/batch.bin",
               "--out=" + dir + "/ember_hf.bin", "--log-level=warn"}) == 0);
  CHECK(Slurp(dir + "/ember.bin") == Slurp(dir + "/ember_hf.bin"));  // f32 export + import is exact
  // The bf16 export: Ember imports the rounded weights and computes in fp32, as PyTorch does below.
  REQUIRE(RunCommand({tool, "--spec=" + dir + "/job.yaml", "--hf=" + sharded, "--batch=" + dir + "/batch.bin",
               "--out=" + dir + "/ember_bf16.bin", "--log-level=warn"}) == 0);
  CHECK(Slurp(dir + "/ember.bin") != Slurp(dir + "/ember_bf16.bin"));

  // Two references read each export: the independent Llama under Debian's torch 1.13, and
  // transformers' own from_pretrained + LlamaForCausalLM under the peers venv's torch 2.15.
  struct Reference {
    std::string python, script;
  };
  const Reference refs[] = {{deploy::kDebianPython, "hf_llama_reference.py"},
                            {Transformers(), "hf_transformers_forward.py"}};
  for (const auto& [export_dir, ember_out] : {std::pair{hf, dir + "/ember.bin"}, std::pair{sharded, dir + "/ember_bf16.bin"}})
  for (const Reference& r : refs) {
    INFO(export_dir << " read by " << r.python << " " << r.script);
    REQUIRE(RunCommand({r.python, Src() + "tests/interop/" + r.script, export_dir, dir + "/batch.bin", dir + "/torch.bin"}) == 0);
    const std::vector<float> ember = Floats(ember_out), ref = Floats(dir + "/torch.bin");
    REQUIRE(ember.size() == static_cast<size_t>(1 + B * T * 384));
    REQUIRE(ref.size() == ember.size());
    INFO("loss ember " << ember[0] << " torch " << ref[0]);
    CHECK(std::abs(ember[0] - ref[0]) <= 1e-5 * std::abs(ref[0]));
    double max_diff = 0, max_ref = 0, worst_rel = 0;
    for (size_t i = 1; i < ref.size(); ++i) {
      const double d = std::abs(double(ember[i]) - ref[i]);
      max_diff = std::max(max_diff, d);
      max_ref = std::max(max_ref, std::abs(double(ref[i])));
      if (std::abs(ref[i]) > 1e-2) worst_rel = std::max(worst_rel, d / std::abs(ref[i]));
    }
    INFO("logits: max |diff| " << max_diff << ", max |logit| " << max_ref << ", worst elementwise rel (|logit| > 0.01) " << worst_rel);
    CHECK(max_diff <= 1e-5 * max_ref);
    CHECK(max_ref > 1);
    WARN("interop (" << r.script << "): loss ember " << ember[0] << " torch " << ref[0] << "; logits max|diff|/max|logit| "
                                << max_diff / max_ref << ", worst elementwise rel " << worst_rel);
  }

  // Import at world size 3 with lr 0: the weights pass through unchanged, so the export is the same.
  const std::string dir2 = NewJobDir("llama_import");
  std::ofstream(dir2 + "/tokens.bin", std::ios::binary) << Slurp(dir + "/tokens.bin");
  REQUIRE(RunCommand({"cp", "-r", hf, dir2 + "/hf"}) == 0);
  WriteLlamaSpec(dir2, sha, 30, 0.f, "checkpoint: {init_from: hf}\n");
  for (int c : RunJob(addr, "llama_import", dir2, 3, 0)) REQUIRE(c == 0);
  REQUIRE(RunCommand({Src() + "launcher/emberctl", "ckpt", "export", dir2 + "/checkpoints", dir2 + "/hf2", "--format", "hf"}) == 0);
  CHECK(Slurp(dir2 + "/hf2/config.json") == Slurp(hf + "/config.json"));
  const std::string a = Slurp(hf + "/model.safetensors");
  CHECK(a.size() > 100000);
  CHECK(a == Slurp(dir2 + "/hf2/model.safetensors"));  // both saved at step 30
  // The first step's loss is the trained model's loss on that data: finite and well below ln(384).
  auto l2 = Losses(dir2);
  REQUIRE(l2.size() == 30);
  CHECK(l2[1] < 0.9 * std::log(384.0));

  // A spec that disagrees with config.json fails before training, naming the field.
  WriteLlamaSpec(dir2, sha, 30, 0.f, "checkpoint: {init_from: hf, dir: other}\n");
  std::string spec = Slurp(dir2 + "/job.yaml");
  spec.replace(spec.find("n_kv_heads: 2"), 13, "n_kv_heads: 4");
  std::ofstream(dir2 + "/job.yaml") << spec;
  for (int c : RunJob(addr, "llama_bad", dir2, 1, 0)) CHECK(c != 0);
  CHECK(Losses(dir2).size() == 30);  // no step was taken (metrics unchanged)
  auto client = store::Client::Connect({.address = addr});
  REQUIRE(client.ok());
  auto exit = client->Get(job::keys::WorkerExit("llama_bad", 0, 0));
  REQUIRE(exit.ok());
  jobs::v1::WorkerExit we;
  REQUIRE(we.ParseFromString(*exit));
  INFO(we.error());
  CHECK(absl::StrContains(we.error(), "config.json: num_key_value_heads is 2, the job spec has 4 (model.n_kv_heads)"));
}

}  // namespace
}  // namespace ember::worker
