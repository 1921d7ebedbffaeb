// Test helpers for tests that run the real ember-store binary (declared as `data` of the test).
// Not thread-safe beyond what Catch2's REQUIRE/FAIL allow (call from the test's main thread).
#ifndef EMBER_RUNTIME_STORE_STORE_PROCESS_TEST_UTIL_H_
#define EMBER_RUNTIME_STORE_STORE_PROCESS_TEST_UTIL_H_

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include <catch2/catch.hpp>

namespace ember::store::testing {

// The ember-store binary in the test's runfiles.
inline std::string StoreBinary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  REQUIRE(srcdir != nullptr);
  return absl::StrCat(srcdir, "/ember/runtime/store/ember-store");
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
