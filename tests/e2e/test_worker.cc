// A stand-in ember-worker for the daemon's end-to-end tests: a real process that honours the
// worker environment contract (DESIGN.md) and behaves as its job name says:
//
//   name contains "fail-r<R>-c<C>"  rank R exits with code C after two progress reports
//   name contains "hang"            every rank sleeps until it is signalled
//   name contains "deaf"            ignores SIGTERM and the stop key: runs on until SIGKILL (a
//                                   worker that holds its device through the daemon's kill_grace)
//   name contains "patient"         gives up on an unreachable store after 60 s, not 3 s
//   otherwise                       `steps` steps of 20 ms each, progress to the store, a
//                                   checkpoint marker per rank at the end, exit 0
//
// Exit codes as ember-worker: 0 success, 2 bad spec/env, 1 runtime failure, 75 stopped (the
// attempt's `stop` key appeared). Like ember-worker it reads the environment and writes its records
// through runtime/job, survives its daemon (a restarted daemon re-attaches) and leaves its exit
// status under worker_exit/<rank> (on success); it exits on its own when the
// store has been unreachable for 3 s, so a crashed test (the store lives in the test) never leaves
// it behind.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proto/jobs.pb.h"
#include "runtime/job/env.h"
#include "runtime/job/keys.h"
#include "runtime/jobspec/spec.h"
#include "runtime/store/client.h"

namespace {

namespace job = ember::job;

}  // namespace

int main() {
  // The daemon sets every variable, also those a worker may default (ember-worker's FromEnv does).
  for (const char* name : {job::kEnvAttempt, job::kEnvDevice, job::kEnvLocalRank,
                           job::kEnvLocalWorldSize, job::kEnvNodeRank}) {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') {
      std::cerr << "test_worker: missing env " << name << "\n";
      return 2;
    }
  }
  auto env = job::WorkerEnv::FromEnv(getenv);
  if (!env.ok()) {
    std::cerr << "test_worker: " << env.status() << "\n";
    return 2;
  }
  const int rank = env->rank, world = env->world_size;
  const std::string& dir = env->job_dir;
  auto spec = ember::spec::LoadJobSpec(dir + "/job.yaml");
  if (!spec.ok()) {
    std::cerr << "test_worker: " << spec.status() << "\n";
    return 2;
  }
  ember::store::ClientOptions co;
  co.address = env->store_addr;
  if (!env->auth_token_file.empty()) {
    std::ifstream f(env->auth_token_file);
    f >> co.auth_token;
  }
  co.connect_timeout = absl::Seconds(10);
  co.default_timeout = absl::Seconds(10);
  // A patient worker keeps trying to connect as long as it would outlast an unreachable store, so
  // a store refusing its token while it starts does not end it before its daemon acts.
  const bool patient = spec->name().find("patient") != std::string::npos;
  const absl::Time connect_start = absl::Now();
  auto store = ember::store::Client::Connect(co);
  while (!store.ok() && patient && absl::Now() - connect_start < absl::Seconds(60)) {
    absl::SleepFor(absl::Milliseconds(200));
    store = ember::store::Client::Connect(co);
  }
  if (!store.ok()) {
    std::cerr << "test_worker: store: " << store.status() << "\n";
    return 1;
  }
  std::cout << "test_worker rank " << rank << "/" << world << " on " << env->device << " job "
            << env->job_id << " attempt " << env->attempt << std::endl;

  const std::string& name = spec->name();
  int fail_rank = -1, fail_code = 0;
  std::smatch m;
  if (std::regex_search(name, m, std::regex("fail-r([0-9]+)-c([0-9]+)"))) {
    fail_rank = std::stoi(m[1]);
    fail_code = std::stoi(m[2]);
  }
  bool hang = name.find("hang") != std::string::npos;
  const bool deaf = name.find("deaf") != std::string::npos;
  if (deaf) ::signal(SIGTERM, SIG_IGN);
  const absl::Duration give_up = patient ? absl::Seconds(60) : absl::Seconds(3);
  int64_t steps = hang ? (1LL << 40) : spec->steps();
  ember::store::Client attempt = store->WithPrefix(env->prefix());
  absl::Time start = absl::Now();
  absl::Time last_ok = absl::Now();
  ember::store::CallOptions quick;
  quick.timeout = absl::Seconds(1);
  for (int64_t step = 1; step <= steps; ++step) {
    auto stop = attempt.Get(job::keys::kStop, quick);
    if (stop.ok() && !deaf) {
      std::cout << "test_worker rank " << rank << " stopping: " << *stop << std::endl;
      return 75;
    }
    if (stop.ok() || absl::IsNotFound(stop.status())) last_ok = absl::Now();
    if (absl::Now() - last_ok > give_up) return 1;  // the store (the test) is gone
    double loss = 5.0 / (1.0 + 0.1 * step);
    double secs = absl::ToDoubleSeconds(absl::Now() - start);
    ember::jobs::v1::Progress p;
    p.mutable_metrics()->set_step(step);
    p.set_steps(hang ? 0 : steps);
    p.mutable_metrics()->set_loss(loss);
    p.mutable_metrics()->set_lr(0.001);
    p.mutable_metrics()->set_grad_norm(1.0);
    p.mutable_metrics()->set_tokens_per_s(step * 1000 / std::max(secs, 1e-3));
    p.set_eta_s(hang ? 0.0 : (steps - step) * 0.02);
    p.mutable_metrics()->set_peak_rss_bytes(1000000);
    (void)attempt.Set(job::keys::ProgressOf(rank), p.SerializeAsString());
    std::cout << "step " << step << " loss " << loss << std::endl;
    if (rank == fail_rank && step == 2) {
      std::cout << "test_worker: failing on purpose with code " << fail_code << std::endl;
      return fail_code;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::filesystem::create_directories(absl::StrCat(dir, "/checkpoints/step-", steps));
  std::ofstream(absl::StrCat(dir, "/checkpoints/step-", steps, "/rank-", rank)) << "ok\n";
  std::cout << "test_worker rank " << rank << " done" << std::endl;
  ember::jobs::v1::WorkerExit done;
  done.set_exit_code(0);
  (void)attempt.Set(job::keys::WorkerExitOf(rank), done.SerializeAsString(), quick);
  return 0;
}
