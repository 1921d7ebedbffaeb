// Test helpers for tests that run the real ember-store binary (declared as `data` of the test).
// Not thread-safe beyond what Catch2's REQUIRE/FAIL allow (call from the test's main thread).
#ifndef EMBER_RUNTIME_STORE_STORE_PROCESS_TEST_UTIL_H_
#define EMBER_RUNTIME_STORE_STORE_PROCESS_TEST_UTIL_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include <catch2/catch.hpp>

namespace ember::store::testing {

// A loopback TCP port that was free a moment ago (bound to port 0, then closed).
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

// The ember-store binary in the test's runfiles.
inline std::string StoreBinary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  REQUIRE(srcdir != nullptr);
  return absl::StrCat(srcdir, "/ember/runtime/store/ember-store");
}

// Starts `args` (argv[0] a path) as a child that dies with the test (PR_SET_PDEATHSIG), its
// stdout and stderr to `log` (empty: inherited; "/dev/null" to drop them). Returns its pid.
inline pid_t SpawnChild(std::vector<std::string> args, const std::string& log = "") {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a test that died
    if (!log.empty()) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// The port ember-store wrote to `port_file` (--port-file), waiting up to 10 s for it.
inline int WaitPort(const std::string& port_file) {
  for (int i = 0; i < 1000; ++i) {
    std::ifstream f(port_file);
    int port = 0;
    if (f >> port && port > 0) return port;
    absl::SleepFor(absl::Milliseconds(10));
  }
  FAIL("ember-store did not report its port within 10 s");
  return 0;
}

}  // namespace ember::store::testing

#endif  // EMBER_RUNTIME_STORE_STORE_PROCESS_TEST_UTIL_H_
