// PASS/FAIL lines of the GPU check binaries (tests/gpu/*_check.cc): one line per check, flushed at
// once so a hang or crash on the device still shows what passed. Not thread-safe (checks report
// from one thread).
#ifndef EMBER_TESTS_GPU_CHECK_REPORT_H_
#define EMBER_TESTS_GPU_CHECK_REPORT_H_

#include <cstdio>
#include <string>

namespace ember::gpu_check {

inline int& FailedChecks() {
  static int failed = 0;
  return failed;
}

inline void Report(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++FailedChecks();
}

}  // namespace ember::gpu_check

#endif  // EMBER_TESTS_GPU_CHECK_REPORT_H_
