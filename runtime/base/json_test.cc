#include "runtime/base/json.h"

#include <catch2/catch.hpp>

namespace ember::json {
namespace {

TEST_CASE("json parses and writes back", "[json]") {
  auto v = Parse(R"( {"a": [1, -2, 3.5, true, false, null], "b": {"c": "x\"y\u00e9\n"},
                     "big": 9223372036854775807} )");
  REQUIRE(v.ok());
  REQUIRE(v->Find("big")->is_int());
  CHECK(v->Find("big")->as_int() == INT64_MAX);
  CHECK(v->Find("a")->array()[2].as_double() == 3.5);
  CHECK(v->Find("b")->Find("c")->as_string() == "x\"y\xc3\xa9\n");
  auto again = Parse(Write(*v));
  REQUIRE(again.ok());
  CHECK(Write(*again) == Write(*v));
  CHECK(Write(*Parse(Write(*v, 2))) == Write(*v));
}

TEST_CASE("json rejects what is not strict JSON", "[json]") {
  const char* bad[] = {
      "", "{", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "01", "1.", "-", "+1", "NaN", "Infinity",
      "{\"a\":1}x", "\"\x01\"", "\"\\x\"", "\"\\ud800\"", "\"\xff\"", "\"\xc0\xaf\"",
      "{\"a\":1,\"a\":2}", "1e999", "tru", "[", "\"abc", "{\"a\":}", "//c\n1",
  };
  for (const char* b : bad) {
    INFO(b);
    CHECK_FALSE(Parse(b).ok());
  }
  std::string deep(100, '[');
  deep += std::string(100, ']');
  CHECK_FALSE(Parse(deep).ok());
  std::string ok_deep(60, '[');
  ok_deep += std::string(60, ']');
  CHECK(Parse(ok_deep).ok());
}

TEST_CASE("json integers beyond int64 become doubles", "[json]") {
  auto v = Parse("18446744073709551616");
  REQUIRE(v.ok());
  CHECK(v->type() == Value::Type::kDouble);
}

}  // namespace
}  // namespace ember::json
