// ember-worker: one training process per device. Reads the worker environment (runtime/job/env.h)
// and the job spec (--spec, else $EMBER_JOB_SPEC, else $EMBER_JOB_DIR/job.yaml), then trains
// (trainer.h).
//
// Exit codes: 0 success; 2 bad spec or environment (the message names the field or variable);
// 1 runtime failure; 75 stopped because the job was told to stop or SIGTERM (stop_watch.h); 76
// checkpointed and stopped because the job was told to drain (cancel --checkpoint).
//
// Two binaries share this main: ember-worker (CPU kernels only) and ember-worker-cuda (also the
// GPU training loop, :cuda_loop, with the CUDA kernels and cuBLAS, which cost each process ~95 MiB
// at start). ember-worker given EMBER_DEVICE=cuda:N execs ember-worker-cuda from its own directory.
// A third, ember-worker-cuda-interp (test-only), is ember-worker-cuda on the CUDA interpreter: cuda
// ranks train on an emulated GPU with EMBER_EMULATE_GPUS=1 (cuda_trainer.h, docs/gpu-testing.md).
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "runtime/base/flags.h"
#include "runtime/flight/recorder.h"
#include "runtime/job/env.h"
#include "runtime/worker/cuda_trainer.h"
#include "runtime/worker/stop_watch.h"
#include "runtime/worker/trainer.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, spec, "", "job spec (YAML/JSON); default $EMBER_JOB_SPEC or $EMBER_JOB_DIR/job.yaml");

namespace {

// A cuda rank started as the CPU ember-worker: exec ember-worker-cuda from the same directory
// (same arguments and environment). Where it is missing or fails to start, this binary goes on and
// Train reports that it has no GPU loop.
void HandOverCudaRank(char** argv) {
  const char* device = std::getenv(ember::job::kEnvDevice);
  if (device == nullptr || !absl::StartsWith(device, "cuda") ||
      ember::worker::GetCudaState() != nullptr) {
    return;
  }
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return;
  std::string cuda_worker = (self.parent_path() / "ember-worker-cuda").string();
  if (access(cuda_worker.c_str(), X_OK) != 0) {
    spdlog::warn("{}={}: no {} beside this ember-worker", ember::job::kEnvDevice, device, cuda_worker);
    return;
  }
  spdlog::info("{}={}: handing over to {}", ember::job::kEnvDevice, device, cuda_worker);
  std::fflush(nullptr);
  argv[0] = cuda_worker.data();
  execv(cuda_worker.c_str(), argv);
  spdlog::error("starting {} failed: {}", cuda_worker, std::strerror(errno));
}

}  // namespace

// A training step frees and re-allocates the same activation and gradient buffers every step
// (model::Driver keeps a unit's activations from its forward to its backward). With glibc's
// defaults the freed top of the heap goes back to the kernel (trim threshold 128 KiB, raised only
// by mmap'd frees) and comes back as fresh zero pages the next step: the tiny-gpt main job took
// 615k minor page faults and 1.8 s of system CPU against 401k and 1.0-1.4 s before issue 32's
// driver. Keep freed memory in the heap (a rank's peak is reached every step anyway) and serve
// blocks up to 32 MiB (glibc's largest mmap threshold) from it.
static void KeepFreedMemory() {
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
}

int main(int argc, char** argv) {
  KeepFreedMemory();
  // A crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) prints a symbolized stack trace to stderr
  // (the rank's log) before the process dies of the signal as before, so a rank that dies in CI or
  // in a job says where. Installed first: the SIGTERM handler below replaces absl's for SIGTERM,
  // and the CUDA interpreter installs its own SIGSEGV/SIGBUS handler at each launch.
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  ember::base::ParseFlagsAndInitLogging(argc, argv, "ember-worker");
  HandOverCudaRank(argv);
  ember::worker::InstallStopSignalHandler();  // SIGTERM: dump the flight recorder, exit 75
  // SIGUSR1: dump the flight recorder and keep training (the process groups' watchdogs poll the
  // counter the handler bumps; docs/flight-recorder.md). Without it SIGUSR1 would kill the rank.
  ember::flight::InstallDumpSignalHandler(SIGUSR1);
  auto env = ember::job::WorkerEnv::FromEnv([](const char* n) { return std::getenv(n); });
  if (!env.ok()) {
    spdlog::error("bad environment: {}", env.status().ToString());
    return 2;
  }
  auto plan = ember::worker::Prepare(*env, absl::GetFlag(FLAGS_spec));
  if (!plan.ok()) {
    spdlog::error("bad job: {}", plan.status().ToString());
    return 2;
  }
  bool drained = false;
  absl::Status st = ember::worker::Train(*plan, &drained);
  if (!st.ok()) spdlog::error("rank {} failed: {}", env->rank, st.ToString());
  // Everything durable is written; skip static destructors and gRPC's shutdown (trainer.h).
  spdlog::shutdown();
  std::fflush(nullptr);
  _exit(!st.ok() ? 1 : drained ? ember::worker::kExitDrained : 0);
}
