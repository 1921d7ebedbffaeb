// The real worker's GPU path end to end on an emulated GPU: ember-worker-cuda-interp (worker_main.cc
// with cuda_loop.cc and GptCuda over the CUDA interpreter, kernels/cuda/interp) trains a one-rank
// EMBER_DEVICE=cuda:0 job, EMBER_EMULATE_GPUS=1, and the same job runs on cpu in ember-worker. Each
// step's loss (cosine schedule with warmup: the LR changes every step) must agree within 1e-4 relative and every checkpointed tensor (parameters and AdamW
// moments, saved from the GPU through the host mirror) within 1e-3 of its largest magnitude: the
// tolerances of tests/gpu/gpt_cuda_check (fp32 in different reduction orders; Adam amplifies
// rounding of near-zero gradients, docs/gpu-testing.md). And the switch: ember-worker-cuda (a real
// GPU build) refuses EMBER_EMULATE_GPUS=1 at Prepare, ember-worker-cuda-interp refuses a cuda rank
// without it (exit 2, the message naming the variable). And a cpu checkpoint resumes on the
// interpreted GPU.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "proto/jobs.pb.h"
#include "runtime/job/env.h"
#include "runtime/job/keys.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/worker/cuda_trainer.h"
#include "runtime/worker/worker_harness.h"

namespace ember::worker {
namespace {

// d 64 in 2 heads of 32 (the CUDA attention's head sizes are 32 and 64), context 32, batch 2,
// checkpoints every 2 steps.
void WriteGpuSpec(const std::string& dir, const std::string& arch, int steps = 4,
                  const std::string& schedule = "schedule: cosine, warmup_steps: 2") {
  std::ofstream f(dir + "/job.yaml");
  f << "name: t\n"
       "model: {" << arch << "vocab_size: 256, context_length: 32, n_layers: 2, n_heads: 2, d_model: 64}\n"
       "data: {text_path: corpus.txt}\n"
       "optimizer: {lr: 0.003, " << schedule << ", grad_clip: 1.0}\n"
       "checkpoint: {every_steps: 2}\n"
       "steps: " << steps << "\nbatch_size: 2\nseed: 7\ndeterministic: true\nthreads: 1\n";
}

// Runs the job in `dir` on one rank of `binary` with EMBER_DEVICE=device (+ extra variables).
// Its stderr is kept in dir/stderr.log (Stderr).
int RunOne(const std::string& addr, const std::string& id, const std::string& dir, const std::string& device,
           const std::string& binary, std::map<std::string, std::string> extra = {}, int attempt = 0) {
  job::WorkerEnv e;
  e.store_addr = addr;
  e.job_id = id;
  e.attempt = attempt;
  e.job_dir = dir;
  e.device = device;
  for (const auto& [k, v] : e.ToEnv()) extra[k] = v;
  return WaitAll({Spawn(extra, binary, dir + "/stderr.log")}, absl::Seconds(240))[0];
}

std::string Stderr(const std::string& dir) {
  std::ifstream f(dir + "/stderr.log");
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// max |a - b| / max |b| over the tensor's f32 values.
double RelMaxDiff(const std::string& a, const std::string& b) {
  REQUIRE(a.size() == b.size());
  const size_t n = a.size() / sizeof(float);
  std::vector<float> x(n), y(n);
  std::memcpy(x.data(), a.data(), a.size());
  std::memcpy(y.data(), b.data(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(y[i])));
  }
  return scale == 0 ? diff : diff / scale;
}

// The latest checkpoints of two job directories: step `step`, the same tensors, every f32 one
// (parameters and AdamW moments) within 1e-3 of its largest magnitude.
void CheckSameCheckpoint(const std::string& got, const std::string& want, int64_t step) {
  auto rg = ckpt::CheckpointReader::Open(got + "/checkpoints");
  auto rw = ckpt::CheckpointReader::Open(want + "/checkpoints");
  REQUIRE(rg.ok());
  REQUIRE(rw.ok());
  CHECK((*rg)->metadata().step == step);
  CHECK((*rw)->metadata().step == step);
  REQUIRE((*rg)->metadata().tensors.size() == (*rw)->metadata().tensors.size());
  int compared = 0;
  for (const ckpt::TensorMeta& t : (*rw)->metadata().tensors) {
    if (t.dtype != ckpt::DType::kF32) continue;
    auto a = (*rg)->ReadFull(t.name);
    auto b = (*rw)->ReadFull(t.name);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    INFO(t.name);
    CHECK(RelMaxDiff(*a, *b) <= 1e-3);
    ++compared;
  }
  CHECK(compared >= 3 * 12);  // parameters and both moments of at least 12 tensors
}

TEST_CASE("a one-rank cuda job on the interpreted GPU trains as the cpu job does", "[worker][cuda][interp]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  for (const std::string arch : {"", "arch: llama, n_kv_heads: 1, "}) {
    DYNAMIC_SECTION("model {" << arch << "...}") {
      const std::string tag = arch.empty() ? "gpt" : "llama";
      const std::string cpu = NewJobDir("cpu-" + tag), gpu = NewJobDir("gpu-" + tag);
      WriteGpuSpec(cpu, arch);
      WriteGpuSpec(gpu, arch);
      REQUIRE(RunOne(addr, "cpu-" + tag, cpu, "cpu", "runtime/worker/ember-worker") == 0);
      const int rc = RunOne(addr, "gpu-" + tag, gpu, "cuda:0", "runtime/worker/ember-worker-cuda-interp",
                            {{job::kEnvEmulateGpus, "1"}});
      if (rc != 0) FAIL("ember-worker-cuda-interp exited " << rc << ": " << Stderr(gpu));
      CHECK(absl::StrContains(Stderr(gpu), "on the CUDA interpreter: an emulated GPU on the CPU"));
      const std::map<int64_t, double> lc = Losses(cpu), lg = Losses(gpu);
      REQUIRE(lc.size() == 4);
      REQUIRE(lg.size() == 4);
      for (const auto& [step, l] : lc) {
        INFO("step " << step);
        CheckClose(lg.at(step), l, 1e-4);
      }
      // The GPU path's own metrics: device memory from the interpreter's allocator.
      std::ifstream m(gpu + "/metrics/rank-0.jsonl");
      const std::string first((std::istreambuf_iterator<char>(m)), std::istreambuf_iterator<char>());
      CHECK(absl::StrContains(first, "\"device_memory_bytes\""));
      CHECK(!absl::StrContains(first, "\"mfu\""));  // no peak for an emulated GPU
      CheckSameCheckpoint(gpu, cpu, 4);
    }
  }
}

// A cpu job's step-2 checkpoint resumed on the interpreted GPU (parameters, AdamW moments and step
// uploaded by SyncDevice) continues as the uninterrupted cpu job does; constant LR, so a 2-step job
// and the first 2 steps of a 4-step one are the same.
TEST_CASE("a cpu checkpoint resumes on the interpreted GPU", "[worker][cuda][interp]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  const std::string ref = NewJobDir("resume-ref"), dir = NewJobDir("resume");
  WriteGpuSpec(ref, "", 4, "schedule: constant");
  REQUIRE(RunOne(addr, "resume-ref", ref, "cpu", "runtime/worker/ember-worker") == 0);
  WriteGpuSpec(dir, "", 2, "schedule: constant");
  REQUIRE(RunOne(addr, "resume", dir, "cpu", "runtime/worker/ember-worker") == 0);
  WriteGpuSpec(dir, "", 4, "schedule: constant");
  const int rc = RunOne(addr, "resume", dir, "cuda:0", "runtime/worker/ember-worker-cuda-interp",
                        {{job::kEnvEmulateGpus, "1"}}, /*attempt=*/1);
  if (rc != 0) FAIL("ember-worker-cuda-interp exited " << rc << ": " << Stderr(dir));
  const std::map<int64_t, double> a = Losses(ref), b = Losses(dir);
  REQUIRE(b.size() == 4);
  for (int64_t step = 1; step <= 4; ++step) {
    INFO("step " << step);
    CheckClose(b.at(step), a.at(step), step <= 2 ? 1e-6 : 1e-4);  // 1, 2 on cpu both times
  }
  CheckSameCheckpoint(dir, ref, 4);
}

TEST_CASE("the emulated-GPU switch: refused by the real GPU worker, required by the interpreter's", "[worker][cuda][interp]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  const std::string a = NewJobDir("emu-real"), b = NewJobDir("emu-missing");
  WriteGpuSpec(a, "");
  WriteGpuSpec(b, "");
  CHECK(RunOne(addr, "emu-real", a, "cuda:0", "runtime/worker/ember-worker-cuda", {{job::kEnvEmulateGpus, "1"}}) == 2);
  std::string err = Stderr(a);
  INFO(err);
  CHECK(absl::StrContains(err, absl::StrCat(job::kEnvEmulateGpus, ": 1 with ", job::kEnvDevice, "=cuda:0: this ember-worker runs real GPUs only")));
  CHECK(RunOne(addr, "emu-missing", b, "cuda:0", "runtime/worker/ember-worker-cuda-interp") == 2);
  err = Stderr(b);
  INFO(err);
  CHECK(absl::StrContains(err, absl::StrCat(job::kEnvEmulateGpus, ": unset with ", job::kEnvDevice, "=cuda:0: this is ember-worker-cuda-interp")));
}

}  // namespace
}  // namespace ember::worker
