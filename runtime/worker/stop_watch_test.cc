// StopWatcher in real processes (it ends them with _exit): a store server and a watcher are forked
// children of this test, which never starts threads or gRPC itself, so forking stays safe.
// "The store does not answer" is the store process SIGSTOPped: its connections stay open and
// every request hangs until its deadline, as across a cut link.
#include "runtime/worker/stop_watch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/flight/recorder.h"
#include "runtime/job/keys.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"

namespace ember::worker {
namespace {

// A forked child running `body`, which may send one line back with Tell; the destructor SIGKILLs
// and reaps it if it is still there.
class Child {
 public:
  explicit Child(const std::function<void(int tell_fd)>& body) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      close(fds[0]);
      body(fds[1]);
      _exit(99);  // bodies end the process themselves
    }
    close(fds[1]);
    read_fd_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      kill(pid_, SIGCONT);
      waitpid(pid_, nullptr, 0);
    }
    close(read_fd_);
  }
  pid_t pid() const { return pid_; }

  // The child's line ("" if it ended without one).
  std::string Hear() {
    std::string line;
    char c;
    while (read(read_fd_, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }

  // The exit code once the child ended, -1 if it was killed by a signal, -2 if still running after
  // `timeout` (then it is killed); *took = how long it ran from the call.
  int WaitExit(absl::Duration timeout, absl::Duration* took) {
    const absl::Time start = absl::Now();
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (absl::Now() - start > timeout) return -2;
      absl::SleepFor(absl::Milliseconds(2));
    }
    *took = absl::Now() - start;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  bool Running() { return waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  pid_t pid_ = -1;
  int read_fd_ = -1;
};

void Tell(int fd, const std::string& line) {
  const std::string s = line + "\n";
  (void)!write(fd, s.data(), s.size());
}

// A store server child; tells its address.
void ServeStore(int tell_fd) {
  auto server = store::StoreServer::Start({});
  if (!server.ok()) _exit(3);
  Tell(tell_fd, (*server)->address());
  for (;;) pause();
}

// A watcher child like ember-worker's (rank 3, dumps to `dump_dir`); tells "ready" once started,
// after `then` ran.
void Watch(const std::string& store_addr, const std::string& dump_dir,
           const std::function<void(store::Client&)>& then, int tell_fd) {
  InstallStopSignalHandler();
  auto client = store::Client::Connect({.address = store_addr});
  if (!client.ok()) _exit(4);
  store::Client attempt = client->WithPrefix(job::keys::AttemptPrefix("j", 0));
  flight::FlightRecorder recorder;
  StopWatcher watcher(attempt, &recorder, dump_dir, /*rank=*/3, absl::Milliseconds(100));
  watcher.Start();
  then(attempt);
  Tell(tell_fd, "ready");
  absl::SleepFor(absl::Seconds(60));
  _exit(5);  // nothing stopped it
}

std::string NewDir(const std::string& name) {
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  REQUIRE(system(("rm -rf '" + dir + "'").c_str()) == 0);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST_CASE("SIGTERM stops the worker within a second while the store does not answer") {
  Child store(ServeStore);
  const std::string addr = store.Hear();
  REQUIRE(!addr.empty());
  const std::string dir = NewDir("sigterm");
  Child worker([&](int fd) { Watch(addr, dir, [](store::Client&) {}, fd); });
  REQUIRE(worker.Hear() == "ready");
  absl::SleepFor(absl::Milliseconds(300));  // polls the (answering) store a few times
  REQUIRE(worker.Running());

  REQUIRE(kill(store.pid(), SIGSTOP) == 0);  // the store goes silent
  absl::SleepFor(absl::Milliseconds(400));  // a poll of `stop` is now stuck (2 s deadline)
  REQUIRE(worker.Running());
  REQUIRE(kill(worker.pid(), SIGTERM) == 0);
  absl::Duration took;
  const int code = worker.WaitExit(absl::Seconds(10), &took);
  INFO("exit " << code << " after " << absl::FormatDuration(took));
  fprintf(stderr, "SIGTERM -> exit %d after %s\n", code, absl::FormatDuration(took).c_str());
  CHECK(code == kExitStopped);
  CHECK(took < absl::Seconds(1));
  const std::string dump = ReadFile(dir + "/rank-3.json");
  CHECK(dump.find("\"stop: SIGTERM\"") != std::string::npos);
}

TEST_CASE("the stop key stops the worker with its text as the reason") {
  Child store(ServeStore);
  const std::string addr = store.Hear();
  REQUIRE(!addr.empty());
  const std::string dir = NewDir("stop_key");
  Child worker([&](int fd) {
    Watch(addr, dir, [](store::Client& attempt) {
      if (!attempt.Set(job::keys::kStop, "rank 1 died").ok()) _exit(6);
    }, fd);
  });
  absl::Duration took;
  const int code = worker.WaitExit(absl::Seconds(10), &took);
  INFO("exit " << code << " after " << absl::FormatDuration(took));
  CHECK(code == kExitStopped);
  const std::string dump = ReadFile(dir + "/rank-3.json");
  CHECK(dump.find("\"stop: rank 1 died\"") != std::string::npos);
}

}  // namespace
}  // namespace ember::worker
