// Test harness for multi-process tests of the real ember-worker binary (worker_test.cc,
// publish_test.cc): job directories with the tiny corpus, specs, spawning ranks with the job
// environment, waiting with a hard deadline (children outliving it are SIGKILLed), the losses of
// rank 0's metrics. Test-only; thread-compatible.
#ifndef EMBER_RUNTIME_WORKER_WORKER_HARNESS_H_
#define EMBER_RUNTIME_WORKER_WORKER_HARNESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/job/env.h"

extern char** environ;

namespace ember::worker {

inline std::string Src() { return std::string(getenv("TEST_SRCDIR")) + "/ember/"; }

inline std::string NewJobDir(const std::string& name) {
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  mkdir(dir.c_str(), 0755);
  std::ifstream in(Src() + "examples/data/tiny_corpus.txt", std::ios::binary);
  std::ofstream out(dir + "/corpus.txt", std::ios::binary);
  out << in.rdbuf();
  return dir;
}

inline void WriteSpec(const std::string& dir, int64_t steps, int batch, const std::string& extra = "",
               const std::string& checkpoint = "checkpoint: {every_steps: 5}\n") {
  std::ofstream f(dir + "/job.yaml");
  f << "name: t\n"
       "model: {vocab_size: 256, context_length: 32, n_layers: 2, n_heads: 2, d_model: 32}\n"
       "data: {text_path: corpus.txt}\n"
       "optimizer: {lr: 0.003, schedule: constant, grad_clip: 1.0}\n"
    << checkpoint << "steps: " << steps << "\nbatch_size: " << batch << "\nseed: 7\ndeterministic: true\nthreads: 1\n"
    << extra;
}

// The ember-worker binary Spawn runs, relative to the runfiles root; a test of a worker built
// with more architectures (tests/toy_arch) sets its own.
inline std::string& WorkerBinary() {
  static std::string bin = "runtime/worker/ember-worker";
  return bin;
}

// Starts `binary` (a path under the runfiles root; empty: WorkerBinary()) with the job
// environment; its stderr goes to `stderr_path` when one is given.
inline pid_t Spawn(const std::map<std::string, std::string>& env, const std::string& binary = "",
                   const std::string& stderr_path = "") {
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e) vars.push_back(*e);
  for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    if (!stderr_path.empty()) {
      const int fd = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || dup2(fd, 2) < 0) _exit(126);
    }
    std::string bin = Src() + (binary.empty() ? WorkerBinary() : binary);
    char* argv[] = {bin.data(), const_cast<char*>("--log-level=warn"), nullptr};
    execve(bin.c_str(), argv, envp.data());
    _exit(127);
  }
  return pid;
}

// Exit codes of every rank; kills all of them if any outlives `timeout`.
inline std::vector<int> WaitAll(const std::vector<pid_t>& pids, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<int> codes(pids.size(), -1000);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (codes[i] != -1000 || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      --left;
    }
    if (left > 0 && absl::Now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i)
        if (codes[i] == -1000) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          codes[i] = -999;
        }
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return codes;
}

inline std::vector<int> RunJob(const std::string& addr, const std::string& job_id, const std::string& dir,
                        int world, int attempt) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    job::WorkerEnv e;
    e.store_addr = addr;
    e.job_id = job_id;
    e.attempt = attempt;
    e.rank = e.local_rank = r;
    e.world_size = e.local_world_size = world;
    e.job_dir = dir;
    const auto vars = e.ToEnv();
    pids.push_back(Spawn({vars.begin(), vars.end()}));
  }
  return WaitAll(pids, absl::Seconds(120));
}

// step -> the numeric field `key` ("loss", "grad_norm", ...) of rank `rank`'s metrics
// (jobs.v1.StepMetrics lines, read by hand); a line without it fails the test.
inline std::map<int64_t, double> Series(const std::string& dir, const std::string& key, int rank = 0) {
  std::map<int64_t, double> out;
  std::ifstream f(dir + "/metrics/rank-" + std::to_string(rank) + ".jsonl");
  for (std::string line; std::getline(f, line);) {
    auto field = [&](const std::string& k) {
      const size_t at = line.find("\"" + k + "\":");
      INFO(k << " in " << line);
      REQUIRE(at != std::string::npos);
      size_t p = at + k.size() + 3;
      if (line[p] == '"') ++p;  // protobuf's JSON form quotes int64 values
      double v = 0;
      REQUIRE(absl::SimpleAtod(line.substr(p, line.find_first_of("\",}", p) - p), &v));
      return v;
    };
    out[static_cast<int64_t>(field("step"))] = field(key);
  }
  return out;
}

// step -> global loss from rank 0's metrics.
inline std::map<int64_t, double> Losses(const std::string& dir) { return Series(dir, "loss"); }

inline void CheckClose(double a, double b, double rel) {
  INFO(a << " vs " << b);
  CHECK(std::abs(a - b) <= rel * std::abs(b));
}

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_WORKER_HARNESS_H_
