#include <cerrno>
#include <thread>

#include <catch2/catch.hpp>

#include "runtime/base/clock.h"
#include "runtime/base/logging.h"
#include "runtime/base/status_macros.h"

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

}  // namespace
}  // namespace ember::base
