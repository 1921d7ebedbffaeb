// A stand-in ember-worker for the daemon's end-to-end tests: a real process that honours the
// worker environment contract (DESIGN.md) and behaves as its job name says:
//
//   name contains "fail-r<R>-c<C>"  rank R exits with code C after two progress reports
//   name contains "hang"            every rank sleeps until it is signalled
//   otherwise                       `steps` steps of 20 ms each, progress to the store, a
//                                   checkpoint marker per rank at the end, exit 0
//
// Exit codes as ember-worker: 0 success, 2 bad spec/env, 1 runtime failure, 75 stopped (the
// attempt's `stop` key appeared). Like ember-worker it survives its daemon (a restarted daemon
// re-attaches) and leaves its exit status under worker_exit/<rank>; it exits on its own when the
// store has been unreachable for 3 s, so a crashed test (the store lives in the test) never leaves
// it behind.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "runtime/jobspec/spec.h"
#include "runtime/store/client.h"

namespace {

const char* Env(const char* name) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') {
    std::cerr << "test_worker: missing env " << name << "\n";
    exit(2);
  }
  return v;
}

}  // namespace

int main() {
  std::string store_addr = Env("EMBER_STORE_ADDR");
  std::string job = Env("EMBER_JOB_ID");
  int attempt = atoi(Env("EMBER_ATTEMPT"));
  int rank = atoi(Env("EMBER_RANK"));
  int world = atoi(Env("EMBER_WORLD_SIZE"));
  std::string device = Env("EMBER_DEVICE");
  std::string dir = Env("EMBER_JOB_DIR");
  Env("EMBER_LOCAL_RANK");
  Env("EMBER_LOCAL_WORLD_SIZE");
  Env("EMBER_NODE_RANK");
  auto spec = ember::spec::LoadJobSpec(dir + "/job.yaml");
  if (!spec.ok()) {
    std::cerr << "test_worker: " << spec.status() << "\n";
    return 2;
  }
  ember::store::ClientOptions co;
  co.address = store_addr;
  if (const char* tf = getenv("EMBER_AUTH_TOKEN_FILE")) {
    std::ifstream f(tf);
    f >> co.auth_token;
  }
  co.connect_timeout = absl::Seconds(10);
  co.default_timeout = absl::Seconds(10);
  auto store = ember::store::Client::Connect(co);
  if (!store.ok()) {
    std::cerr << "test_worker: store: " << store.status() << "\n";
    return 1;
  }
  std::cout << "test_worker rank " << rank << "/" << world << " on " << device << " job " << job
            << " attempt " << attempt << std::endl;

  const std::string& name = spec->name();
  int fail_rank = -1, fail_code = 0;
  std::smatch m;
  if (std::regex_search(name, m, std::regex("fail-r([0-9]+)-c([0-9]+)"))) {
    fail_rank = std::stoi(m[1]);
    fail_code = std::stoi(m[2]);
  }
  bool hang = name.find("hang") != std::string::npos;
  int64_t steps = hang ? (1LL << 40) : spec->steps();
  const std::string attempt_prefix = absl::StrCat("jobs/", job, "/attempt/", attempt, "/");
  std::string prefix = attempt_prefix + absl::StrCat("progress/", rank);
  absl::Time start = absl::Now();
  absl::Time last_ok = absl::Now();
  ember::store::CallOptions quick;
  quick.timeout = absl::Seconds(1);
  for (int64_t step = 1; step <= steps; ++step) {
    auto stop = store->Get(attempt_prefix + "stop", quick);
    if (stop.ok()) {
      std::cout << "test_worker rank " << rank << " stopping: " << *stop << std::endl;
      return 75;
    }
    if (absl::IsNotFound(stop.status())) last_ok = absl::Now();
    if (absl::Now() - last_ok > absl::Seconds(3)) return 1;  // the store (the test) is gone
    double loss = 5.0 / (1.0 + 0.1 * step);
    double secs = absl::ToDoubleSeconds(absl::Now() - start);
    std::string json = absl::StrFormat(
        "{\"step\":%d,\"steps\":%d,\"loss\":%.4f,\"lr\":0.001,\"grad_norm\":1.0,"
        "\"tokens_per_s\":%.1f,\"eta_s\":%.2f,\"peak_rss_bytes\":1000000}",
        step, hang ? 0 : steps, loss, step * 1000 / std::max(secs, 1e-3),
        hang ? 0.0 : (steps - step) * 0.02);
    (void)store->Set(prefix, json);
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
  (void)store->Set(attempt_prefix + absl::StrCat("worker_exit/", rank), "0", quick);
  return 0;
}
