// make-tokens: turns any file into a token file with the byte-level tokenizer (token id = byte
// value, vocabulary 256), as flat little-endian uint16 or uint32 ids (TokenFile's layout).
//
//   make-tokens --input=corpus.txt --output=corpus.bin [--dtype=uint16]
// Exit codes: 0 ok, 2 bad flags, 1 I/O failure.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "runtime/base/files.h"
#include "runtime/base/flags.h"
#include "runtime/data/token_file.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, input, "", "text (or any) file to tokenize");
ABSL_FLAG(std::string, output, "", "token file to write");
ABSL_FLAG(std::string, dtype, "uint16", "token id width: uint16 or uint32");

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "make-tokens");
  const std::string in = absl::GetFlag(FLAGS_input), out = absl::GetFlag(FLAGS_output);
  auto dtype = ember::data::ParseTokenDtype(absl::GetFlag(FLAGS_dtype));
  if (in.empty() || out.empty() || !dtype.ok() || *dtype == ember::data::TokenDtype::kU8) {
    spdlog::error("usage: make-tokens --input=TEXT --output=TOKENS [--dtype=uint16|uint32]");
    return 2;
  }
  std::ifstream f(in, std::ios::binary);
  if (!f) {
    spdlog::error("cannot open --input '{}'", in);
    return 1;
  }
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t w = ember::data::TokenDtypeSize(*dtype);
  std::string bytes(text.size() * w, '\0');
  for (size_t i = 0; i < text.size(); ++i) {
    const uint32_t id = static_cast<uint8_t>(text[i]);
    for (size_t b = 0; b < w; ++b) bytes[i * w + b] = static_cast<char>((id >> (8 * b)) & 0xff);
  }
  if (absl::Status s = ember::base::WriteFileAtomic(out, bytes); !s.ok()) {
    spdlog::error("cannot write --output '{}': {}", out, s.ToString());
    return 1;
  }
  spdlog::info("{}: {} bytes -> {} tokens ({}, vocab 256) in {}", in, text.size(), text.size(),
               absl::GetFlag(FLAGS_dtype), out);
  return 0;
}
