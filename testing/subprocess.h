// Running a command from a test: fork, exec (PATH lookup), wait. Test-only; thread-compatible.
#ifndef EMBER_TESTING_SUBPROCESS_H_
#define EMBER_TESTING_SUBPROCESS_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace ember::testing {

// Runs argv[0] (searched in PATH) with `argv`, its stdout redirected to `stdout_path`; returns the
// exit status, or -1 when it was killed by a signal (127: it could not be executed).
inline int RunCommand(std::vector<std::string> argv, const std::string& stdout_path = "/dev/null") {
  pid_t pid = fork();
  if (pid == 0) {
    if (!freopen(stdout_path.c_str(), "w", stdout)) _exit(126);
    std::vector<char*> a;
    for (std::string& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace ember::testing

#endif  // EMBER_TESTING_SUBPROCESS_H_
