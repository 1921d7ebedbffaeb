// Packed region descriptors: round trip, and every malformed form refused with INVALID_ARGUMENT.
#include "runtime/onesided/descriptor.h"

#include <catch2/catch.hpp>
#include <limits>
#include <set>

#include "absl/strings/escaping.h"

namespace ember::onesided {
namespace {

TEST_CASE("descriptor round trip keeps every field, binary rkey included") {
  RegionDescriptor d{"rank3", 0x7f00deadbeef, (1ull << 36) + 3, std::string("\0\x01\xff rkey", 8),
                     0x8badf00d12345678};
  std::string packed = PackDescriptor(d);
  for (char c : packed) REQUIRE((isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/' || c == '='));
  auto back = UnpackDescriptor(packed);
  REQUIRE(back.ok());
  CHECK(back->owner == d.owner);
  CHECK(back->base == d.base);
  CHECK(back->length == d.length);
  CHECK(back->rkey == d.rkey);
  CHECK(back->token == d.token);
  auto empty = UnpackDescriptor(PackDescriptor({"a", 0, 0, ""}));
  REQUIRE(empty.ok());
  CHECK(empty->length == 0);
}

TEST_CASE("malformed descriptors are refused") {
  const std::string good = PackDescriptor({"r0", 4096, 64, "key"});
  std::string raw;
  REQUIRE(absl::Base64Unescape(good, &raw));
  CHECK(UnpackDescriptor("not base64 !!").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(UnpackDescriptor(absl::Base64Escape("XXXX" + raw.substr(4))).status().code() ==
        absl::StatusCode::kInvalidArgument);
  for (size_t cut = 4; cut < raw.size(); ++cut) {
    INFO("cut at " << cut);
    CHECK(UnpackDescriptor(absl::Base64Escape(raw.substr(0, cut))).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  CHECK(UnpackDescriptor(absl::Base64Escape(raw + "x")).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A descriptor from before region tokens: its own message, naming the version mismatch.
  auto old = UnpackDescriptor(absl::Base64Escape("EOD1" + raw.substr(4)));
  CHECK(old.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(old.status().message().find("EOD1") != absl::string_view::npos);
  // A non-empty region without a key cannot be accessed.
  CHECK(UnpackDescriptor(PackDescriptor({"r0", 4096, 64, ""})).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("region tokens are non-zero and differ") {
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    auto t = NewRegionToken();
    REQUIRE(t.ok());
    CHECK(*t != 0);
    seen.insert(*t);
  }
  CHECK(seen.size() == 1000);
}

TEST_CASE("bounds check is overflow-safe") {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  CHECK(InBounds(0, 0, 0));
  CHECK(InBounds(10, 0, 10));
  CHECK(InBounds(3, 7, 10));
  CHECK_FALSE(InBounds(3, 8, 10));
  CHECK_FALSE(InBounds(11, 0, 10));
  CHECK_FALSE(InBounds(1, kMax, 10));
  CHECK_FALSE(InBounds(kMax, 2, 10));
}

}  // namespace
}  // namespace ember::onesided
