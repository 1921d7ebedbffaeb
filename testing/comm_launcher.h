// Test helper: runs N ranks of tests/comm/comm_worker (or any program) as child processes with a hard deadline;
// every child is killed (SIGKILL) if the deadline passes. Thread-compatible.
#ifndef EMBER_TESTING_COMM_LAUNCHER_H_
#define EMBER_TESTING_COMM_LAUNCHER_H_

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/files.h"

namespace ember::comm::testing {

inline std::string WorkerPath(const std::string& worker = "comm_worker") {
  const char* srcdir = getenv("TEST_SRCDIR");
  return std::string(srcdir ? srcdir : ".") + "/ember/tests/comm/" + worker;
}

inline std::string TempDir(const std::string& tag) {
  const char* t = getenv("TEST_TMPDIR");
  std::string d = std::string(t ? t : "/tmp") + "/" + tag + "-" + std::to_string(getpid()) + "-" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  if (!::ember::base::MakeDirs(d).ok()) return "/tmp";
  return d;
}

struct RunResult {
  std::vector<int> status;  // waitpid status per rank
  bool timed_out = false;
};

// Runs n copies of the program at `path` (rank r gets --rank=r --size=n, then `args`); `env`
// entries are "KEY=VALUE" added to each child's environment.
inline RunResult RunProgram(const std::string& path, int n, const std::vector<std::string>& args,
                            const std::vector<std::string>& env, double timeout_s) {
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<std::string> a = {path, "--rank=" + std::to_string(r), "--size=" + std::to_string(n)};
      a.insert(a.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& s : a) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      execv(path.c_str(), argv.data());
      _exit(127);
    }
    pids[r] = pid;
  }
  RunResult res;
  res.status.assign(n, -1);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (res.status[r] != -1) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        res.status[r] = st;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      res.timed_out = true;
      for (int r = 0; r < n; ++r)
        if (res.status[r] == -1) kill(pids[r], SIGKILL);
      for (int r = 0; r < n; ++r)
        if (res.status[r] == -1) waitpid(pids[r], &res.status[r], 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return res;
}

// RunProgram with tests/comm/<worker> (comm_worker by default).
inline RunResult RunRanks(int n, const std::vector<std::string>& args,
                          const std::vector<std::string>& env, double timeout_s,
                          const std::string& worker = "comm_worker") {
  return RunProgram(WorkerPath(worker), n, args, env, timeout_s);
}

inline bool AllExitZero(const RunResult& r) {
  if (r.timed_out) return false;
  for (int st : r.status)
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return false;
  return true;
}


// Watches `dir` for rank-<r>.json of ranks [0, n) while the ranks run; `seconds()` is how long
// after construction the last one appeared (-1 if not all appeared before Stop()).
class DumpWatcher {
 public:
  DumpWatcher(std::string dir, int n) : dir_(std::move(dir)), n_(n), t0_(std::chrono::steady_clock::now()) {
    thread_ = std::thread([this] {
      while (!stop_) {
        int have = 0;
        for (int r = 0; r < n_; ++r) {
          struct stat st;
          if (stat((dir_ + "/rank-" + std::to_string(r) + ".json").c_str(), &st) == 0) ++have;
        }
        if (have == n_) {
          seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  ~DumpWatcher() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  double seconds() const { return seconds_; }

 private:
  std::string dir_;
  int n_;
  std::chrono::steady_clock::time_point t0_;
  std::atomic<bool> stop_{false};
  std::atomic<double> seconds_{-1};
  std::thread thread_;
};

}  // namespace ember::comm::testing

#endif  // EMBER_TESTING_COMM_LAUNCHER_H_
