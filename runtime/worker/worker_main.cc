// ember-worker: one training process per device. Reads the worker environment (runtime/job/env.h)
// and the job spec (--spec, else $EMBER_JOB_SPEC, else $EMBER_JOB_DIR/job.yaml), then trains
// (trainer.h).
//
// Exit codes: 0 success; 2 bad spec or environment (the message names the field or variable);
// 1 runtime failure; 75 stopped because the job was told to stop or SIGTERM (stop_watch.h).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "runtime/base/flags.h"
#include "runtime/flight/recorder.h"
#include "runtime/job/env.h"
#include "runtime/worker/stop_watch.h"
#include "runtime/worker/trainer.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, spec, "", "job spec (YAML/JSON); default $EMBER_JOB_SPEC or $EMBER_JOB_DIR/job.yaml");

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "ember-worker");
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
  absl::Status st = ember::worker::Train(*plan);
  if (!st.ok()) spdlog::error("rank {} failed: {}", env->rank, st.ToString());
  // Everything durable is written; skip static destructors and gRPC's shutdown (trainer.h).
  spdlog::shutdown();
  std::fflush(nullptr);
  _exit(st.ok() ? 0 : 1);
}
