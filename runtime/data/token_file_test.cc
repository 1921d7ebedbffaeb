#include "runtime/data/token_file.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#include "testing/subprocess.h"

namespace ember::data {
namespace {

std::string TmpPath(const std::string& name) {
  const char* d = getenv("TEST_TMPDIR");
  return absl::StrCat(d ? d : "/tmp", "/", name);
}

std::string WriteU16(const std::string& name, int n) {
  std::string path = TmpPath(name);
  std::ofstream f(path, std::ios::binary);
  for (int i = 0; i < n; ++i) {
    uint16_t v = static_cast<uint16_t>(i % 1000);
    f.write(reinterpret_cast<const char*>(&v), 2);
  }
  return path;
}

TEST_CASE("token file opens, reads and validates", "[data]") {
  auto f = TokenFile::Open(WriteU16("a.bin", 1001), TokenDtype::kU16);
  REQUIRE(f.ok());
  CHECK((*f)->size() == 1001);
  CHECK((*f)->at(7) == 7);
  CHECK((*f)->max_token() == 999);
  CHECK(TokenFile::Open(TmpPath("missing.bin"), TokenDtype::kU16).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(TokenFile::Open(WriteU16("odd.bin", 3), TokenDtype::kU32).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(!ParseTokenDtype("int8").ok());
}

// Gathers the global batch of one step from every rank's slice.
std::vector<int32_t> GlobalBatch(std::shared_ptr<TokenFile> f, int world, int64_t B_total,
                                 int64_t T, int64_t pos) {
  std::vector<int32_t> all;
  for (int r = 0; r < world; ++r) {
    TokenLoader l(f, {.seq_len = T, .batch = B_total / world, .rank = r, .world = world, .seed = 3});
    REQUIRE(l.Validate().ok());
    REQUIRE(l.RestoreState(absl::StrCat("position=", pos, " seq_len=", T, " seed=3")).ok());
    std::vector<int32_t> tok(B_total / world * T), tgt(tok.size());
    REQUIRE(l.Next(tok.data(), tgt.data()).ok());
    for (size_t i = 0; i < tok.size(); ++i) CHECK(tgt[i] == (tok[i] + 1) % 1000);
    all.insert(all.end(), tok.begin(), tok.end());
  }
  return all;
}

TEST_CASE("the global batch does not depend on the world size", "[data]") {
  auto f = *TokenFile::Open(WriteU16("b.bin", 5000), TokenDtype::kU16);
  for (int64_t pos : {0, 4, 400}) {
    auto one = GlobalBatch(f, 1, 4, 16, pos);
    CHECK(GlobalBatch(f, 2, 4, 16, pos) == one);
    CHECK(GlobalBatch(f, 4, 4, 16, pos) == one);
  }
}

TEST_CASE("each epoch is a permutation of the windows, reseeded per epoch", "[data]") {
  auto f = *TokenFile::Open(WriteU16("c.bin", 1000), TokenDtype::kU16);
  TokenLoader l(f, {.seq_len = 10, .batch = 1, .seed = 9});
  const int64_t W = l.windows();
  REQUIRE(W == 99);
  std::set<int64_t> e0, e1;
  std::vector<int64_t> o0, o1;
  for (int64_t g = 0; g < W; ++g) {
    e0.insert(l.WindowOf(g));
    o0.push_back(l.WindowOf(g));
    e1.insert(l.WindowOf(W + g));
    o1.push_back(l.WindowOf(W + g));
  }
  CHECK(static_cast<int64_t>(e0.size()) == W);
  CHECK(static_cast<int64_t>(e1.size()) == W);
  CHECK(o0 != o1);
}

TEST_CASE("loader state round-trips and rejects another seq_len", "[data]") {
  auto f = *TokenFile::Open(WriteU16("d.bin", 3000), TokenDtype::kU16);
  TokenLoader a(f, {.seq_len = 8, .batch = 2, .seed = 1});
  std::vector<int32_t> t1(16), y1(16), t2(16), y2(16);
  REQUIRE(a.Next(t1.data(), y1.data()).ok());
  std::string st = a.SaveState();
  REQUIRE(a.Next(t1.data(), y1.data()).ok());
  TokenLoader b(f, {.seq_len = 8, .batch = 2, .seed = 1});
  REQUIRE(b.RestoreState(st).ok());
  REQUIRE(b.Next(t2.data(), y2.data()).ok());
  CHECK(t1 == t2);
  TokenLoader c(f, {.seq_len = 9, .batch = 2, .seed = 1});
  CHECK(!c.RestoreState(st).ok());
  TokenLoader tiny(f, {.seq_len = 3000, .batch = 1});
  CHECK(!tiny.Validate().ok());
}

TEST_CASE("make-tokens turns the shipped corpus into byte-level uint16 ids", "[data]") {
  const std::string src = std::string(getenv("TEST_SRCDIR")) + "/ember/";
  const std::string out = TmpPath("corpus.bin");
  pid_t pid = fork();
  if (pid == 0) {
    std::string bin = src + "runtime/data/make-tokens";
    std::string in = "--input=" + src + "examples/data/tiny_corpus.txt", o = "--output=" + out;
    execl(bin.c_str(), bin.c_str(), in.c_str(), o.c_str(), "--log-level=warn", nullptr);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  auto toks = *TokenFile::Open(out, TokenDtype::kU16);
  auto text = *TokenFile::Open(src + "examples/data/tiny_corpus.txt", TokenDtype::kU8);
  REQUIRE(toks->size() == text->size());
  CHECK(toks->size() > 100000);
  for (int64_t i = 0; i < toks->size(); i += 997) CHECK(toks->at(i) == text->at(i));
  CHECK(toks->max_token() < 256);
}

TEST_CASE("token file header: tokenizer identity read, old headerless files still read, damage refused", "[data]") {
  const TokenizerInfo spm{"sentencepiece", std::string(64, 'a'), 384, "spm.model"};
  std::string ids;
  for (uint32_t i = 0; i < 100; ++i) ids.append(reinterpret_cast<const char*>(&i), 4);
  const std::string header = TokenFileHeader(TokenDtype::kU32, 100, spm);
  CHECK(header.size() % 8 == 0);
  CHECK(header.substr(0, 8) == "EMBERTOK");
  const std::string path = TmpPath("hdr.bin");
  std::ofstream(path, std::ios::binary) << header << ids;
  auto f = TokenFile::Open(path, TokenDtype::kU32);
  REQUIRE(f.ok());
  CHECK((*f)->size() == 100);
  CHECK((*f)->at(0) == 0);
  CHECK((*f)->at(99) == 99);
  CHECK((*f)->tokenizer().kind == "sentencepiece");
  CHECK((*f)->tokenizer().sha256 == spm.sha256);
  CHECK((*f)->tokenizer().vocab_size == 384);
  CHECK((*f)->tokenizer().model == "spm.model");

  auto wrong = TokenFile::Open(path, TokenDtype::kU16);
  CHECK(wrong.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(wrong.status().message(), "holds uint32 ids (its header), data.token_dtype is uint16"));
  const std::string cut = TmpPath("hdr_cut.bin");
  std::ofstream(cut, std::ios::binary) << header << ids.substr(0, 396);
  auto truncated = TokenFile::Open(cut, TokenDtype::kU32);
  CHECK(absl::StrContains(truncated.status().message(), "100 tokens promised, 396 bytes of ids follow"));

  // Hostile headers: a length past the end of the file, JSON that does not parse, another version.
  std::string huge = header;
  huge[8] = huge[9] = huge[10] = huge[11] = '\xff';
  std::ofstream(TmpPath("hdr_huge.bin"), std::ios::binary) << huge << ids;
  CHECK(absl::StrContains(TokenFile::Open(TmpPath("hdr_huge.bin"), TokenDtype::kU32).status().message(), "exceeds the file"));
  std::string garbled = header;
  garbled[16] = '[';
  std::ofstream(TmpPath("hdr_json.bin"), std::ios::binary) << garbled << ids;
  CHECK(absl::StrContains(TokenFile::Open(TmpPath("hdr_json.bin"), TokenDtype::kU32).status().message(), "header"));
  std::string v2 = header;
  v2[12] = 2;
  std::ofstream(TmpPath("hdr_v2.bin"), std::ios::binary) << v2 << ids;
  CHECK(absl::StrContains(TokenFile::Open(TmpPath("hdr_v2.bin"), TokenDtype::kU32).status().message(), "version 2"));

  auto old = TokenFile::Open(WriteU16("old.bin", 50), TokenDtype::kU16);  // no header
  REQUIRE(old.ok());
  CHECK((*old)->size() == 50);
  CHECK((*old)->tokenizer().kind.empty());
}

using ::ember::testing::RunCommand;

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST_CASE("make-tokens with a SentencePiece model trained at test time matches spm_encode", "[data]") {
  const std::string src = std::string(getenv("TEST_SRCDIR")) + "/ember/";
  const std::string corpus = src + "examples/data/tiny_corpus.txt", prefix = TmpPath("spm");
  REQUIRE(RunCommand({"spm_train", "--input=" + corpus, "--model_prefix=" + prefix, "--vocab_size=384",
               "--model_type=bpe", "--character_coverage=1.0", "--minloglevel=2"}) == 0);
  const std::string out = TmpPath("spm.bin");
  REQUIRE(RunCommand({src + "runtime/data/make-tokens", "--input=" + corpus, "--output=" + out,
               "--tokenizer=sentencepiece", "--spm-model=" + prefix + ".model", "--log-level=warn"}) == 0);
  auto f = TokenFile::Open(out, TokenDtype::kU16);
  REQUIRE(f.ok());
  CHECK((*f)->tokenizer().kind == "sentencepiece");
  CHECK((*f)->tokenizer().vocab_size == 384);
  // Independent references: coreutils' sha256sum, and spm_encode (which also encodes line by line).
  REQUIRE(RunCommand({"sha256sum", prefix + ".model"}, TmpPath("sum.txt")) == 0);
  CHECK(Slurp(TmpPath("sum.txt")).substr(0, 64) == (*f)->tokenizer().sha256);
  REQUIRE(RunCommand({"spm_encode", "--model=" + prefix + ".model", "--output_format=id", "--input=" + corpus},
              TmpPath("ids.txt")) == 0);
  std::vector<uint32_t> want;
  std::istringstream in(Slurp(TmpPath("ids.txt")));
  for (uint32_t id; in >> id;) want.push_back(id);
  REQUIRE((*f)->size() == static_cast<int64_t>(want.size()));
  CHECK((*f)->size() > 10000);
  for (int64_t i = 0; i < (*f)->size(); ++i) REQUIRE((*f)->at(i) == want[i]);
  CHECK((*f)->max_token() < 384);
  CHECK((*f)->max_token() > 255);  // real merges, not bytes

  // Bad flags: a model without --tokenizer=sentencepiece, or a file that is not a model.
  CHECK(RunCommand({src + "runtime/data/make-tokens", "--input=" + corpus, "--output=" + out,
             "--spm-model=" + prefix + ".model", "--log-level=off"}) == 2);
  CHECK(RunCommand({src + "runtime/data/make-tokens", "--input=" + corpus, "--output=" + out,
             "--tokenizer=sentencepiece", "--spm-model=" + corpus, "--log-level=off"}) == 1);
}

}  // namespace
}  // namespace ember::data
