#include "runtime/base/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

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

TEST_CASE("WriteFileAtomic replaces a file whole and leaves no temporary behind") {
  std::string d = TempDir();
  REQUIRE(WriteFileAtomic(d + "/state", "first\n").ok());
  REQUIRE(WriteFileAtomic(d + "/state", "second, longer\n", 0600).ok());
  auto r = ReadRegularFile(d + "/state", 100);
  REQUIRE(r.ok());
  CHECK(*r == "second, longer\n");  // replaced, not appended or mixed
  struct stat st;
  CHECK(stat((d + "/state.tmp").c_str(), &st) != 0);
  // The mode applies to the new file (the rename carries the temporary's mode).
  REQUIRE(stat((d + "/state").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  // A temporary left behind by a crash, with a looser mode, does not loosen the new file.
  std::ofstream(d + "/secret.tmp") << "stale";
  REQUIRE(chmod((d + "/secret.tmp").c_str(), 0666) == 0);
  REQUIRE(WriteFileAtomic(d + "/secret", "token\n", 0600).ok());
  REQUIRE(stat((d + "/secret").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(ReadRegularFile(d + "/secret", 100).value() == "token\n");
  REQUIRE(WriteFileAtomic(d + "/empty", "").ok());
  CHECK(ReadRegularFile(d + "/empty", 1).value().empty());
}

TEST_CASE("WriteFileAtomic names the path when it cannot write, and keeps the old file") {
  std::string d = TempDir();
  absl::Status s = WriteFileAtomic(d + "/no/such/dir/state", "x");
  CHECK(absl::IsNotFound(s));
  CHECK(s.message().find(d + "/no/such/dir/state.tmp") != std::string::npos);
  // A directory where the file should go: the rename fails, the temporary is cleaned up.
  REQUIRE(mkdir((d + "/adir").c_str(), 0755) == 0);
  REQUIRE(mkdir((d + "/adir/sub").c_str(), 0755) == 0);
  s = WriteFileAtomic(d + "/adir", "x");
  CHECK(!s.ok());
  CHECK(s.message().find("rename") != std::string::npos);
  struct stat st;
  CHECK(stat((d + "/adir.tmp").c_str(), &st) != 0);
  CHECK(stat((d + "/adir/sub").c_str(), &st) == 0);
}

TEST_CASE("MakeDirs creates missing parents, accepts existing ones, refuses a file") {
  std::string d = TempDir();
  REQUIRE(MakeDirs(d + "/a/b/c").ok());
  struct stat st;
  REQUIRE(stat((d + "/a/b/c").c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK(MakeDirs(d + "/a/b/c").ok());  // already there
  CHECK(MakeDirs(d + "/a/b/c/").ok());
  std::ofstream(d + "/file") << "x";
  absl::Status s = MakeDirs(d + "/file");
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message().find(d + "/file") != std::string::npos);
  CHECK(!MakeDirs(d + "/file/below").ok());
}

TEST_CASE("WriteAll writes every byte through a pipe that takes them in pieces") {
  int p[2];
  REQUIRE(pipe(p) == 0);
  // 1 MiB through a pipe (64 KiB buffer): write(2) returns short counts while a reader drains it.
  std::string data(1 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + i / 251);
  std::string got;
  std::thread reader([&] {
    char buf[4096];
    ssize_t n;
    while ((n = read(p[0], buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
  });
  absl::Status s = WriteAll(p[1], data, "the pipe");
  close(p[1]);
  reader.join();
  close(p[0]);
  REQUIRE(s.ok());
  CHECK(got == data);
  // A descriptor that cannot be written: the error names what was being written.
  s = WriteAll(-1, "x", "wal.log");
  CHECK(!s.ok());
  CHECK(s.message().find("write wal.log") != std::string::npos);
  CHECK(WriteAll(-1, "", "nothing").ok());  // nothing to write: no syscall, no error
}

TEST_CASE("CopyFile copies bytes and mode, and never overwrites") {
  std::string d = TempDir();
  std::string data(200000, 'a');  // several 64 KiB chunks plus a partial one
  data[0] = 'x';
  data[data.size() - 1] = 'z';
  REQUIRE(WriteFileAtomic(d + "/from", data).ok());
  REQUIRE(CopyFile(d + "/from", d + "/to", 0600).ok());
  CHECK(ReadRegularFile(d + "/to", 1 << 20).value() == data);
  struct stat st;
  REQUIRE(stat((d + "/to").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(WriteFileAtomic(d + "/other", "keep me").ok());
  absl::Status s = CopyFile(d + "/from", d + "/other");
  CHECK(absl::IsAlreadyExists(s));
  CHECK(s.message().find(d + "/other") != std::string::npos);
  CHECK(ReadRegularFile(d + "/other", 100).value() == "keep me");
  CHECK(absl::IsNotFound(CopyFile(d + "/missing", d + "/to2")));
  CHECK(stat((d + "/to2").c_str(), &st) != 0);
}

}  // namespace
}  // namespace ember::base
