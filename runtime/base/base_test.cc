#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>
#include <thread>

#include <catch2/catch.hpp>

#include "runtime/base/clock.h"
#include "runtime/base/logging.h"
#include "runtime/base/status_macros.h"
#include "spdlog/spdlog.h"

namespace ember::base {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

absl::Status Check(int x) {
  RETURN_IF_ERROR(Half(x));
  return absl::OkStatus();
}

TEST_CASE("status macros propagate the first error") {
  REQUIRE(*Quarter(8) == 2);
  REQUIRE(Quarter(6).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(Check(3).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(Check(4).ok());
  REQUIRE(ErrnoToStatus(ENOENT, "open x").code() == absl::StatusCode::kNotFound);
  REQUIRE(Annotate(absl::InternalError("b"), "a").message() == "a: b");
}

TEST_CASE("fake clock wakes sleepers on Advance") {
  FakeClock clock;
  absl::Time start = clock.Now();
  std::thread t([&] { clock.SleepUntil(start + absl::Seconds(10)); });
  clock.Advance(absl::Seconds(5));
  clock.Advance(absl::Seconds(5));
  t.join();
  REQUIRE(clock.Now() - start == absl::Seconds(10));
  REQUIRE(clock.MonotonicNanos() == 10'000'000'000LL);
}

TEST_CASE("json escape handles control characters and quotes") {
  REQUIRE(JsonEscape("a\"b\\c\n\x01") == "a\\\"b\\\\c\\n\\u0001");
  LogFormat f;
  REQUIRE(ParseLogFormat("json", &f).ok());
  REQUIRE(f == LogFormat::kJson);
  REQUIRE(ParseLogFormat("xml", &f).code() == absl::StatusCode::kInvalidArgument);
}

// Issue 12: a job name with a newline forged a whole daemon log line.
TEST_CASE("human log lines escape control characters; one message is one line") {
  REQUIRE(EscapeControl("a\nb\r\t\x01\x7f\\ok") == "a\\nb\\r\\t\\x01\\x7f\\ok");
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/human.log";
  std::remove(path.c_str());
  REQUIRE(InitLogging({.format = LogFormat::kHuman, .file = path}).ok());
  spdlog::info("job {} submitted", "evil\n2026-12-01 00:00:00.000 I ember[1] job root-owned submitted");
  spdlog::default_logger()->flush();
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("job evil\\n2026-12-01 00:00:00.000 I ember[1] job root-owned submitted") !=
        std::string::npos);
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("off"));  // release the file
}

}  // namespace
}  // namespace ember::base
