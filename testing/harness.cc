#include "testing/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/daemon/process.h"
#include "runtime/job/env.h"

namespace ember::recovery {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string TinySpec(const std::string& name, int world, int steps, int every,
                     const std::string& extra) {
  return absl::StrCat(
      "name: ", name, "\n",
      "model: {vocab_size: 256, context_length: 32, n_layers: 1, n_heads: 2, d_model: 32, "
      "mlp: gelu}\n",
      "data: {text_path: data/tiny_corpus.txt}\n",
      "optimizer: {name: adamw, lr: 0.003, schedule: cosine, warmup_steps: 4}\n",
      "parallelism: {strategy: fsdp, world_size: ", world, "}\n",
      "checkpoint: {dir: checkpoints, every_steps: ", every, ", keep_last: 2}\n",
      "resources: {device_type: cpu}\n", "steps: ", steps, "\nbatch_size: 4\nseed: 1\n",
      "threads: 1\nlog_every: 1\ndeterministic: true\n", extra);
}

std::string Corpus() { return ReadFile("examples/data/tiny_corpus.txt"); }

std::map<std::string, std::string> ProcessEnv(pid_t pid) {
  std::map<std::string, std::string> out;
  std::string raw = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
  for (absl::string_view kv : absl::StrSplit(raw, '\0', absl::SkipEmpty())) {
    size_t eq = kv.find('=');
    if (eq != absl::string_view::npos) {
      out[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
    }
  }
  return out;
}

pid_t RankPid(const std::string& job, int attempt, int rank) {
  for (pid_t pid : daemon::FindJobProcesses(job)) {
    auto env = ProcessEnv(pid);
    if (env[job::kEnvRank] == absl::StrCat(rank) && env[job::kEnvAttempt] == absl::StrCat(attempt)) {
      auto info = daemon::ReadProcInfo(pid);
      if (info && info->state != 'Z') return pid;
    }
  }
  return -1;
}

absl::StatusOr<std::unique_ptr<EmberdProcess>> EmberdProcess::Start(const Options& o,
                                                                     int incarnation) {
  auto p = std::make_unique<EmberdProcess>();
  p->log_ = absl::StrCat(o.work_root, "/", o.node, ".", incarnation, ".log");
  std::vector<std::string> args = {
      o.emberd, "--node-name=" + o.node, "--store=" + o.store, "--auth-token-file=" + o.token_file,
      "--work-root=" + o.work_root, "--worker-binary=" + o.worker,
      absl::StrCat("--cpu-slots=", o.slots), "--cuda-devices=0",
      absl::StrCat("--lease-ttl-s=", o.lease_ttl_s), "--poll-s=0.05", "--restart-backoff-s=0.2",
      "--listen=127.0.0.1:0"};
  args.insert(args.end(), o.extra_flags.begin(), o.extra_flags.end());
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    int fd = open(p->log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  p->pid_ = pid;
  std::regex ready("ready: api (127\\.0\\.0\\.1:[0-9]+)");
  const bool ok = WaitFor([&] {
    std::smatch m;
    std::string text = ReadFile(p->log_);
    if (std::regex_search(text, m, ready)) p->address_ = m[1];
    return !p->address_.empty();
  }, absl::Seconds(20), absl::Milliseconds(10));
  if (!ok) return absl::DeadlineExceededError("emberd did not start: " + ReadFile(p->log_));
  return p;
}

void EmberdProcess::Kill9() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int EmberdProcess::Signal(int sig) {
  if (pid_ <= 0) return -1;
  kill(pid_, sig);
  int status = 0;
  // Up to 30 s: a drain stops the node's ranks first, which a loaded 2-core CI machine (other
  // tests beside this one) has been seen to take over 10 s for.
  for (int i = 0; i < 3000; ++i) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

EmberdProcess::~EmberdProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGINT);
  for (int i = 0; i < 500; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

std::string Runfile(const char* argv0, const std::string& rel) {
  for (std::string c : {rel, absl::StrCat(argv0, ".runfiles/ember/", rel)}) {
    if (std::filesystem::exists(c)) return std::filesystem::absolute(c).string();
  }
  return rel;
}

void EnterRunfiles(const char* argv0) {
  if (!std::filesystem::exists("examples/data/tiny_corpus.txt")) {
    std::filesystem::current_path(
        std::filesystem::path(Runfile(argv0, "examples/data/tiny_corpus.txt")).parent_path() / "../..");
  }
}

}  // namespace ember::recovery
