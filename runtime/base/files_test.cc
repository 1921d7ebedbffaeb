#include "runtime/base/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

namespace ember::base {
namespace {

std::string TempDir() {
  std::string t = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/filesXXXXXX";
  REQUIRE(mkdtemp(t.data()) != nullptr);
  return t;
}

TEST_CASE("ReadRegularFile reads a regular file and enforces the size limit") {
  std::string d = TempDir();
  std::ofstream(d + "/f") << "hello";
  auto r = ReadRegularFile(d + "/f", 5);
  REQUIRE(r.ok());
  CHECK(*r == "hello");
  auto big = ReadRegularFile(d + "/f", 4);
  CHECK(absl::IsOutOfRange(big.status()));
  CHECK(absl::IsNotFound(ReadRegularFile(d + "/missing", 10).status()));
}

// Without the regular-file check, open(2) of a FIFO with no writer blocks forever; the alarm turns
// such a hang into a failure within seconds.
TEST_CASE("A FIFO, a device or a directory is refused at once, never read") {
  std::string d = TempDir();
  REQUIRE(mkfifo((d + "/fifo").c_str(), 0600) == 0);
  alarm(20);
  auto fifo = ReadRegularFile(d + "/fifo", 1 << 20);
  CHECK(absl::IsInvalidArgument(fifo.status()));
  CHECK(fifo.status().message().find("is a FIFO") != std::string::npos);
  auto zero = ReadRegularFile("/dev/zero", 1 << 20);
  CHECK(absl::IsInvalidArgument(zero.status()));
  CHECK(zero.status().message().find("character device") != std::string::npos);
  CHECK(absl::IsInvalidArgument(OpenRegularFile(d).status()));
  alarm(0);
}

}  // namespace
}  // namespace ember::base
