// Multi-rank cuda jobs of the real worker on emulated GPUs: W processes of ember-worker-cuda-interp
// (EMBER_DEVICE=cuda:0 each, one emulated GPU per process, EMBER_EMULATE_GPUS=1) train a job as
// data parallel ranks -- GptCuda's step on the CUDA interpreter, the gradients all-reduced over
// the device group (the NCCL policy backend, nccl-lazy on 2 ranks and nccl on 4, over the cpu
// communicator driver, a strict fake of NCCL: ops finish later on another thread, calls return
// "in progress" at random and must be polled, a violation aborts the rank) -- and the same
// job runs on W cpu ranks of ember-worker (FSDP). The references are the cpu jobs, computed by a
// different stack (CPU kernels, reduce-scatter of row shards): every step's loss within 1e-5
// relative (fp32; W = 2 and 4 are powers of two, so the 1/W scaling is exact on both sides) and
// every checkpointed tensor (parameters, AdamW moments; each rank saved its rows from its own
// replica) within 1e-4 of its largest magnitude. And checkpoints move: one saved by 2 cuda ranks
// resumes on 2 cpu ranks, one saved by 2 cpu ranks resumes on 4 cuda ranks, each ending where the
// uninterrupted job does.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "runtime/job/env.h"
#include "runtime/store/server.h"
#include "runtime/worker/worker_harness.h"

namespace ember::worker {
namespace {

constexpr char kInterp[] = "runtime/worker/ember-worker-cuda-interp";
constexpr char kCpu[] = "runtime/worker/ember-worker";

// The smallest model the CUDA attention takes (one head of 32), context 16, batch 2 per rank; the
// cosine schedule changes the LR every step; clipping on (the global norm over all gradients).
void WriteDpSpec(const std::string& dir, bool cuda, int steps, const std::string& schedule,
                 const std::string& backend = "") {
  std::ofstream f(dir + "/job.yaml");
  f << "name: t\n"
       "model: {vocab_size: 256, context_length: 16, n_layers: 1, n_heads: 1, d_model: 32}\n"
       "data: {text_path: corpus.txt}\n"
       "optimizer: {lr: 0.003, "
    << schedule << ", grad_clip: 1.0}\n"
                   "checkpoint: {every_steps: 2}\n"
                   "parallelism: {strategy: fsdp"
    << (backend.empty() ? "" : ", backend: " + backend) << "}\n"
    << (cuda ? "resources: {device_type: cuda}\n" : "") << "steps: " << steps
    << "\nbatch_size: 2\nseed: 7\ndeterministic: true\nthreads: 1\n";
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Runs the job in `dir` on `world` ranks: cuda (ember-worker-cuda-interp, cuda:0 each, emulated)
// or cpu (ember-worker). Each rank's stderr goes to dir/stderr-<rank>.log. Returns "" when every
// rank exited 0, else the exit codes and the failing ranks' stderr.
std::string RunRanks(const std::string& addr, const std::string& id, const std::string& dir, int world,
                     bool cuda, int attempt = 0) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    job::WorkerEnv e;
    e.store_addr = addr;
    e.job_id = id;
    e.attempt = attempt;
    e.rank = e.local_rank = r;
    e.world_size = e.local_world_size = world;
    e.job_dir = dir;
    e.device = cuda ? "cuda:0" : "cpu";
    std::map<std::string, std::string> vars;
    for (const auto& [k, v] : e.ToEnv()) vars[k] = v;
    if (cuda) vars[job::kEnvEmulateGpus] = "1";
    pids.push_back(Spawn(vars, cuda ? kInterp : kCpu, absl::StrCat(dir, "/stderr-", r, ".log")));
  }
  const std::vector<int> rc = WaitAll(pids, absl::Seconds(180));
  std::string out;
  for (int r = 0; r < world; ++r) {
    if (rc[r] == 0) continue;
    absl::StrAppend(&out, "rank ", r, " exited ", rc[r], ":\n", ReadFile(absl::StrCat(dir, "/stderr-", r, ".log")));
  }
  return out;
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

// The latest checkpoints of two job directories: step `step`, the same tensors (assembled from
// every rank's rows by the reader), every f32 one within `tol` of its largest magnitude.
void CheckSameCheckpoint(const std::string& got, const std::string& want, int64_t step, double tol) {
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
    CHECK(RelMaxDiff(*a, *b) <= tol);
    ++compared;
  }
  CHECK(compared >= 3 * 7);  // parameters and both moments of every tensor of the 1-layer model
}

// step -> `field` (a number) from rank `rank`'s metrics (worker_harness.h's Series).
std::map<int64_t, double> Field(const std::string& dir, int rank, const std::string& field) {
  return Series(dir, field, rank);
}

// Every rank's view of every step against the cpu job's same rank: its own batch's loss
// (local_loss: each rank trained its own data shard) and the pre-clip global gradient norm (each
// cuda rank computes it from its own replica's all-reduced gradients: a rank that skipped the
// all-reduce or scaled by the wrong world size shows here directly, before clipping and AdamW
// hide most of it).
void CheckEveryRank(const std::string& got, const std::string& want, int world, double rel) {
  for (int r = 0; r < world; ++r) {
    for (const std::string field : {"local_loss", "grad_norm"}) {
      const std::map<int64_t, double> g = Field(got, r, field), w = Field(want, r, field);
      REQUIRE(!w.empty());
      REQUIRE(g.size() == w.size());
      for (const auto& [step, v] : w) {
        INFO("rank " << r << " step " << step << " " << field);
        CheckClose(g.at(step), v, rel);
      }
    }
  }
}

void CheckLosses(const std::string& got, const std::string& want, int steps, double rel) {
  const std::map<int64_t, double> lg = Losses(got), lw = Losses(want);
  REQUIRE(static_cast<int>(lw.size()) == steps);
  REQUIRE(static_cast<int>(lg.size()) == steps);
  for (const auto& [step, l] : lw) {
    INFO("step " << step);
    CheckClose(lg.at(step), l, rel);
  }
}

// Steps 1, 2 by attempt 0, steps 3, 4 by attempt 1 (which resumed from the step-2 checkpoint
// instead of starting over).
void CheckResumed(const std::string& dir) {
  const std::map<int64_t, double> a = Field(dir, 0, "attempt");
  CHECK(a == std::map<int64_t, double>{{1, 0}, {2, 0}, {3, 1}, {4, 1}});
}

TEST_CASE("2 and 4 cuda ranks on interpreted GPUs train as the same job on cpu ranks", "[worker][cuda][interp][dp]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  // nccl-lazy on 2 ranks (the communicator made at the first all-reduce), nccl on 4 (at group
  // creation).
  for (const auto& [world, backend] : std::vector<std::pair<int, std::string>>{{2, "nccl-lazy"}, {4, "nccl"}}) {
    DYNAMIC_SECTION("world " << world << " " << backend) {
      const std::string tag = absl::StrCat("w", world);
      const std::string cpu = NewJobDir("cpu-" + tag), gpu = NewJobDir("gpu-" + tag);
      WriteDpSpec(cpu, false, 4, "schedule: cosine, warmup_steps: 2");
      WriteDpSpec(gpu, true, 4, "schedule: cosine, warmup_steps: 2", backend);
      const std::string cpu_err = RunRanks(addr, "cpu-" + tag, cpu, world, false);
      if (!cpu_err.empty()) FAIL(cpu_err);
      const std::string gpu_err = RunRanks(addr, "gpu-" + tag, gpu, world, true);
      if (!gpu_err.empty()) FAIL(gpu_err);
      const std::string log0 = ReadFile(gpu + "/stderr-0.log");
      INFO(log0);
      CHECK(absl::StrContains(log0, absl::StrCat("data parallel over ", world, " ranks (replicated; gradients "
                                                 "all-reduced on the device, ", backend, ")")));
      CHECK(absl::StrContains(log0, "on the CUDA interpreter"));
      CheckLosses(gpu, cpu, 4, 1e-5);
      CheckEveryRank(gpu, cpu, world, 1e-5);
      // The device all-reduce moved the gradient arena on every rank.
      for (int r = 0; r < world; ++r) {
        std::ifstream m(absl::StrCat(gpu, "/metrics/rank-", r, ".jsonl"));
        std::string line;
        REQUIRE(std::getline(m, line));
        CHECK(absl::StrContains(line, "\"all_reduce\""));
      }
      CheckSameCheckpoint(gpu, cpu, 4, 1e-4);
    }
  }
}

// Checkpoints between cuda and cpu ranks (the host mirror's rows are cpu FSDP's rows): constant LR,
// so a 2-step job and the first 2 steps of a 4-step one are the same; the resumed job ends where
// the uninterrupted one does.
TEST_CASE("checkpoints move between cuda and cpu ranks", "[worker][cuda][interp][dp]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  const std::string constant = "schedule: constant";

  SECTION("saved by 2 cuda ranks, resumed on 2 cpu ranks") {
    const std::string ref = NewJobDir("ref2"), dir = NewJobDir("cuda-to-cpu");
    WriteDpSpec(ref, false, 4, constant);
    REQUIRE(RunRanks(addr, "ref2", ref, 2, false).empty());
    WriteDpSpec(dir, true, 2, constant);
    const std::string gpu_err = RunRanks(addr, "cuda-to-cpu", dir, 2, true);
    if (!gpu_err.empty()) FAIL(gpu_err);
    WriteDpSpec(dir, false, 4, constant);
    const std::string cpu_err = RunRanks(addr, "cuda-to-cpu", dir, 2, false, /*attempt=*/1);
    if (!cpu_err.empty()) FAIL(cpu_err);
    CheckLosses(dir, ref, 4, 1e-5);
    CheckResumed(dir);
    CheckSameCheckpoint(dir, ref, 4, 1e-4);
  }

  SECTION("saved by 2 cpu ranks, resumed on 4 cuda ranks") {
    // The reference changes world at the same step: 2 cpu ranks, then 4 cpu ranks from step 2.
    const std::string ref = NewJobDir("ref24"), dir = NewJobDir("cpu-to-cuda");
    for (const std::string& d : {ref, dir}) {
      WriteDpSpec(d, false, 2, constant);
      REQUIRE(RunRanks(addr, d == ref ? "ref24" : "cpu-to-cuda", d, 2, false).empty());
    }
    WriteDpSpec(ref, false, 4, constant);
    REQUIRE(RunRanks(addr, "ref24", ref, 4, false, /*attempt=*/1).empty());
    WriteDpSpec(dir, true, 4, constant);
    const std::string gpu_err = RunRanks(addr, "cpu-to-cuda", dir, 4, true, /*attempt=*/1);
    if (!gpu_err.empty()) FAIL(gpu_err);
    CheckLosses(dir, ref, 4, 1e-5);
    CheckResumed(dir);
    CheckEveryRank(dir, ref, 4, 1e-5);  // ranks 2, 3 have steps 3, 4 only, on both sides
    CheckSameCheckpoint(dir, ref, 4, 1e-4);
  }
}

}  // namespace
}  // namespace ember::worker
