// make-tokens: turns a text file into a token file (TokenFile's layout, header included) with the
// byte-level tokenizer (token id = byte value, vocabulary 256) or a SentencePiece model.
//
//   make-tokens --input=corpus.txt --output=corpus.bin [--dtype=uint16]
//   make-tokens --input=corpus.txt --output=corpus.bin --tokenizer=sentencepiece --spm-model=spm.model
//
// SentencePiece encodes the input line by line (a line's pieces, no BOS/EOS; the newline itself
// is not a token, as SentencePiece treats it as whitespace). The header records the tokenizer:
// kind, the SHA-256 of the model file and its vocabulary size (docs/formats.md); --header=false
// writes the old headerless layout (bytes only). Prints the tokenizer line to put in a job spec.
// Exit codes: 0 ok, 2 bad flags, 1 I/O or tokenizer failure.
#include <openssl/evp.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/files.h"
#include "runtime/base/flags.h"
#include "runtime/data/token_file.h"
#include "runtime/data/spm_tokenizer.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, input, "", "text (or any) file to tokenize");
ABSL_FLAG(std::string, output, "", "token file to write");
ABSL_FLAG(std::string, dtype, "uint16", "token id width: uint16 or uint32");
ABSL_FLAG(std::string, tokenizer, "bytes", "bytes | sentencepiece");
ABSL_FLAG(std::string, spm_model, "", "--tokenizer=sentencepiece: the SentencePiece .model file");
ABSL_FLAG(bool, header, true, "write the tokenizer header (false: the old headerless layout, bytes only)");

namespace {

std::string Sha256Hex(const std::string& bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppend(&hex, absl::Hex(md[i], absl::kZeroPad2));
  return hex;
}

bool ReadAll(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "make-tokens");
  using ember::data::TokenDtype;
  const std::string in = absl::GetFlag(FLAGS_input), out = absl::GetFlag(FLAGS_output);
  const std::string kind = absl::GetFlag(FLAGS_tokenizer), spm_path = absl::GetFlag(FLAGS_spm_model);
  auto dtype = ember::data::ParseTokenDtype(absl::GetFlag(FLAGS_dtype));
  const bool spm = kind == "sentencepiece";
  if (in.empty() || out.empty() || !dtype.ok() || *dtype == TokenDtype::kU8 ||
      (kind != "bytes" && !spm) || spm != !spm_path.empty() || (spm && !absl::GetFlag(FLAGS_header))) {
    spdlog::error("usage: make-tokens --input=TEXT --output=TOKENS [--dtype=uint16|uint32] "
                  "[--tokenizer=bytes | --tokenizer=sentencepiece --spm-model=FILE] [--header=false (bytes only)]");
    return 2;
  }
  std::string text;
  if (!ReadAll(in, &text)) {
    spdlog::error("cannot open --input '{}'", in);
    return 1;
  }
  ember::data::TokenizerInfo tok{"bytes", "", 256, ""};
  std::vector<uint32_t> ids;
  if (spm) {
    std::string model;
    if (!ReadAll(spm_path, &model)) {
      spdlog::error("cannot open --spm-model '{}'", spm_path);
      return 1;
    }
    std::string error;
    auto sp = ember::data::SpmTokenizer::Load(model, &error);
    if (sp == nullptr) {
      spdlog::error("--spm-model '{}' is not a SentencePiece model: {}", spm_path, error);
      return 1;
    }
    tok = {"sentencepiece", Sha256Hex(model), sp->vocab_size(),
           spm_path.substr(spm_path.find_last_of('/') + 1)};
    if (*dtype == TokenDtype::kU16 && tok.vocab_size > 65536) {
      spdlog::error("--spm-model '{}' has {} pieces; ids do not fit uint16, use --dtype=uint32", spm_path, tok.vocab_size);
      return 2;
    }
    size_t begin = 0;
    std::vector<int> line_ids;
    std::string line;
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      line.assign(text, begin, end - begin);
      line_ids.clear();
      if (!sp->Encode(line, &line_ids, &error)) {
        spdlog::error("SentencePiece failed on the line at byte {}: {}", begin, error);
        return 1;
      }
      ids.insert(ids.end(), line_ids.begin(), line_ids.end());
      begin = end + 1;
    }
  } else {
    ids.assign(text.begin(), text.end());
    for (uint32_t& id : ids) id &= 0xff;  // char may be signed
  }
  const size_t w = ember::data::TokenDtypeSize(*dtype);
  std::string bytes = absl::GetFlag(FLAGS_header)
                          ? ember::data::TokenFileHeader(*dtype, static_cast<int64_t>(ids.size()), tok)
                          : std::string();
  const size_t head = bytes.size();
  bytes.resize(head + ids.size() * w);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (size_t b = 0; b < w; ++b) bytes[head + i * w + b] = static_cast<char>((ids[i] >> (8 * b)) & 0xff);
  }
  if (absl::Status s = ember::base::WriteFileAtomic(out, bytes); !s.ok()) {
    spdlog::error("cannot write --output '{}': {}", out, s.ToString());
    return 1;
  }
  spdlog::info("{}: {} bytes -> {} tokens ({}, {}) in {}", in, text.size(), ids.size(),
               absl::GetFlag(FLAGS_dtype), tok.Describe(), out);
  std::printf("tokenizer: {kind: %s%s}  # vocab %lld: model.vocab_size must be >= this\n", tok.kind.c_str(),
              tok.sha256.empty() ? "" : absl::StrCat(", sha256: ", tok.sha256).c_str(),
              static_cast<long long>(tok.vocab_size));
  return 0;
}
