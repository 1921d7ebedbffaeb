#include "checkpoint/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <random>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"

#include "checkpoint/fuzz_targets.h"

namespace ember::ckpt {
namespace {

std::string TmpDir() {
  const char* t = getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

std::string Bytes(std::initializer_list<float> v) {
  return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * sizeof(float));
}

std::string LE64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

std::string WithHeader(const std::string& header, const std::string& data) {
  return LE64(header.size()) + header + data;
}

absl::Status Check(const std::string& file) { return ParseSafetensors(file).status(); }

TEST_CASE("reads the reference implementation's own test vector", "[safetensors]") {
  // From safetensors' Rust tests: a 60-byte header (not 8-aligned: readers must accept it), one
  // I32 [2, 2] tensor of zeros.
  std::string header = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  REQUIRE(header.size() == 60);
  std::string file = std::string("<\0\0\0\0\0\0\0", 8) + header + std::string(16, '\0');
  auto f = SafetensorsFile::FromBytes(file, "vector");
  REQUIRE(f.ok());
  REQUIRE((*f)->tensors().size() == 1);
  const TensorInfo* t = (*f)->Find("test");
  REQUIRE(t != nullptr);
  CHECK(t->dtype == DType::kI32);
  CHECK(t->shape == std::vector<int64_t>{2, 2});
  CHECK((*f)->Data(*t) == std::string(16, '\0'));
}

TEST_CASE("write then read back bitwise, with metadata and a scalar", "[safetensors]") {
  std::string w = Bytes({1.5f, -2.f, 3.25f, 1e-30f, 0.f, -0.f});
  uint16_t bf[3] = {0x3f80, 0xc000, 0x7fc0};
  std::string b(reinterpret_cast<const char*>(bf), sizeof(bf));
  std::string scalar = Bytes({42.f});
  std::string empty;
  std::vector<TensorSpec> specs = {{"layer.0.weight", DType::kF32, {2, 3}},
                                   {"bf", DType::kBF16, {3}},
                                   {"s", DType::kF32, {}},
                                   {"empty", DType::kF32, {0, 4}}};
  std::string path = TmpDir() + "/rt.safetensors";
  REQUIRE(WriteSafetensors(path, specs, {w, b, scalar, empty}, {{"format", "pt"}}).ok());
  auto f = SafetensorsFile::Open(path);
  REQUIRE(f.ok());
  CHECK((*f)->metadata().at("format") == "pt");
  CHECK((*f)->Data(*(*f)->Find("layer.0.weight")) == w);
  CHECK((*f)->Data(*(*f)->Find("bf")) == b);
  CHECK((*f)->Data(*(*f)->Find("s")) == scalar);
  CHECK((*f)->Find("s")->shape.empty());
  CHECK((*f)->Data(*(*f)->Find("empty")).empty());
  // The header is padded to 8 bytes with spaces.
  auto bytes = ReadFile(path, 1 << 20);
  REQUIRE(bytes.ok());
  uint64_t n;
  std::memcpy(&n, bytes->data(), 8);
  CHECK(n % 8 == 0);
}

TEST_CASE("malformed files are errors, never crashes", "[safetensors]") {
  std::string d16(16, '\1');
  auto T = [](const std::string& dtype, const std::string& shape, const std::string& offs) {
    return R"({"t":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offs + "}}";
  };
  CHECK(Check(WithHeader(T("F32", "[4]", "[0,16]"), d16)).ok());
  // Truncated anywhere.
  std::string good = WithHeader(T("F32", "[4]", "[0,16]"), d16);
  for (size_t n = 0; n < good.size(); ++n) {
    INFO(n);
    CHECK_FALSE(Check(good.substr(0, n)).ok());
  }
  // Huge header length, header longer than the file.
  CHECK(absl::StrContains(Check(LE64(1ull << 62) + "{}").message(), "exceeds the limit"));
  CHECK(absl::StrContains(Check(LE64(1000) + "{}").message(), "truncated"));
  // Out of range, overlapping, holes, trailing bytes.
  CHECK_FALSE(Check(WithHeader(T("F32", "[4]", "[0,20]"), d16)).ok());
  CHECK_FALSE(Check(WithHeader(T("F32", "[4]", "[16,32]"), d16)).ok());
  CHECK_FALSE(Check(WithHeader(T("F32", "[4]", "[0,16]"), d16 + "x")).ok());
  CHECK_FALSE(Check(WithHeader(T("F32", "[4]", "[8,4]"), d16)).ok());
  CHECK_FALSE(Check(WithHeader(T("F32", "[4]", "[-1,15]"), d16)).ok());
  CHECK_FALSE(Check(WithHeader(T("F32", "[4]", "[0,18446744073709551616]"), d16)).ok());
  std::string two = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  CHECK(absl::StrContains(Check(WithHeader(two, d16)).message(), "overlap"));
  // Wrong dtype sizes, unknown dtype, bad shapes.
  CHECK(absl::StrContains(Check(WithHeader(T("F64", "[4]", "[0,16]"), d16)).message(), "needs 32"));
  CHECK_FALSE(Check(WithHeader(T("Q7", "[4]", "[0,16]"), d16)).ok());
  CHECK_FALSE(Check(WithHeader(T("F32", "[-4]", "[0,16]"), d16)).ok());
  CHECK_FALSE(Check(WithHeader(T("F32", "[4.0]", "[0,16]"), d16)).ok());
  CHECK_FALSE(Check(WithHeader(T("F32", "[4294967296,4294967296,4294967296]", "[0,16]"), d16)).ok());
  CHECK_FALSE(Check(WithHeader(T("F32", "4", "[0,16]"), d16)).ok());
  // Bad JSON and bad structure.
  CHECK_FALSE(Check(WithHeader(R"({"t":{"dtype":"F32",)", d16)).ok());
  CHECK_FALSE(Check(WithHeader("[1,2]", "")).ok());
  CHECK_FALSE(Check(WithHeader(R"({"__metadata__":{"a":1}})", "")).ok());
  CHECK_FALSE(Check(WithHeader(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[0,0],"x":1}})", "")).ok());
  CHECK(Check(WithHeader(R"x({"__metadata__":{"a":"b"}}  )x", "")).ok());
  // Names the file.
  auto f = SafetensorsFile::FromBytes(good.substr(0, 20), "model.safetensors");
  REQUIRE_FALSE(f.ok());
  CHECK(absl::StrContains(f.status().message(), "model.safetensors"));
}

TEST_CASE("seeded mutation fuzzing of the header parser", "[safetensors][fuzz]") {
  std::vector<TensorSpec> specs = {{"a", DType::kF32, {2, 2}}, {"b", DType::kBF16, {3}},
                                   {"c", DType::kI64, {1}}};
  std::string seed = *SerializeSafetensors(
      specs, {std::string(16, 'a'), std::string(6, 'b'), std::string(8, 'c')}, {{"k", "v"}});
  std::mt19937_64 rng(12345);
  const char* tokens[] = {"0", "1", "-1", "99999999999", "[", "]", "{", "}", ",", "\"", "F64",
                          "__metadata__", "data_offsets", "\\u0000", "1e308", " "};
  int ok = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s = seed;
    int edits = 1 + rng() % 4;
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t pos = rng() % s.size();
      switch (rng() % 5) {
        case 0: s[pos] = static_cast<char>(rng()); break;
        case 1: s.resize(pos); break;
        case 2: s.insert(pos, tokens[rng() % 16]); break;
        case 3: s.erase(pos, 1 + rng() % 8); break;
        case 4: if (s.size() >= 8) s[rng() % 8] = static_cast<char>(rng()); break;
      }
    }
    ok += ParseSafetensors(s).ok();
    FuzzSafetensors(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  // Most mutations are rejected; a few (data bytes) still parse.
  CHECK(ok > 0);
  CHECK(ok < 20000);
}

TEST_CASE("sharded sets with model.safetensors.index.json", "[safetensors]") {
  std::string dir = TmpDir() + "/sharded";
  std::vector<TensorSpec> specs;
  std::vector<std::string> data;
  for (int i = 0; i < 5; ++i) {
    specs.push_back({"w" + std::to_string(i), DType::kF32, {16}});
    data.push_back(std::string(64, static_cast<char>('a' + i)));
  }
  REQUIRE(WriteShardedSafetensors(dir, specs, 130, {}, [&](size_t i, const AppendFn& append) {
            return append(data[i]);
          }).ok());
  CHECK(PathExists(dir + "/model-00003-of-00003.safetensors"));
  auto set = SafetensorsSet::Open(dir + "/model.safetensors.index.json");
  REQUIRE(set.ok());
  CHECK((*set)->names().size() == 5);
  for (int i = 0; i < 5; ++i) {
    auto t = (*set)->Find("w" + std::to_string(i));
    REQUIRE(t.ok());
    CHECK(t->first->Data(*t->second) == data[i]);
  }
  CHECK((*set)->Find("nope").status().code() == absl::StatusCode::kNotFound);
  // An index naming a tensor its file does not hold is an error.
  REQUIRE(base::WriteFileAtomic(dir + "/bad.index.json",
                          R"({"weight_map":{"zz":"model-00001-of-00003.safetensors"}})").ok());
  CHECK_FALSE(SafetensorsSet::Open(dir + "/bad.index.json").ok());
  REQUIRE(base::WriteFileAtomic(dir + "/evil.index.json", R"({"weight_map":{"w0":"../x.safetensors"}})").ok());
  CHECK_FALSE(SafetensorsSet::Open(dir + "/evil.index.json").ok());
}

}  // namespace
}  // namespace ember::ckpt
