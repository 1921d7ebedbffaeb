// Helpers shared by the recovery tests and //bench:recovery_bench: a tiny deterministic job
// spec for the real ember-worker, finding a rank's pid, emberd processes over an in-process store
// (for the tests that kill -9 a daemon). Test-only; thread-compatible.
#ifndef EMBER_TESTING_HARNESS_H_
#define EMBER_TESTING_HARNESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ember::recovery {

template <typename F>
bool WaitFor(F cond, absl::Duration timeout, absl::Duration every = absl::Milliseconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(every);
  }
  return cond();
}

// A tiny GPT (1 layer, d_model 32, context 32) on examples/data/tiny_corpus.txt, deterministic,
// logging every step, checkpointing every `every` steps; `extra` is appended (YAML lines).
std::string TinySpec(const std::string& name, int world, int steps, int every,
                     const std::string& extra = "");
// The corpus the spec names, to upload as data/tiny_corpus.txt (read from the runfiles).
std::string Corpus();

// The environment of a live process (empty when it is gone or unreadable).
std::map<std::string, std::string> ProcessEnv(pid_t pid);
// pid of `rank` of `job`'s attempt `attempt` on this machine, or -1.
pid_t RankPid(const std::string& job, int attempt, int rank);

// An emberd process joining `store` (lease_ttl_s short), logging to <dir>/<node>.<n>.log.
class EmberdProcess {
 public:
  struct Options {
    std::string emberd, worker, store, token_file, work_root, node;
    int slots = 2;
    double lease_ttl_s = 3;
    std::vector<std::string> extra_flags;  // appended to the command line (e.g. --store-listen=)
  };
  static absl::StatusOr<std::unique_ptr<EmberdProcess>> Start(const Options& o, int incarnation);
  ~EmberdProcess();  // SIGINT (drain), then SIGKILL after 5 s; reaps

  void Kill9();      // kill -9 and reap
  // Sends `sig` and waits up to 30 s for the exit; returns the exit code (-1 if it did not exit).
  int Signal(int sig);
  const std::string& address() const { return address_; }
  const std::string& log() const { return log_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::string address_, log_;
};

std::string ReadFile(const std::string& path);

// A bench binary's runfile: `rel` as given when it exists (bazel run), else under
// <argv0>.runfiles/ember/ (the binary run directly); an absolute path.
std::string Runfile(const char* argv0, const std::string& rel);
// Makes the runfiles root the working directory unless examples/data/tiny_corpus.txt is already
// reachable from it (what Corpus() reads).
void EnterRunfiles(const char* argv0);

}  // namespace ember::recovery

#endif  // EMBER_TESTING_HARNESS_H_
