// Token files and the deterministic, resumable, rank-sliced loader that feeds training.
//
// A token file is a flat little-endian array of token ids, uint16 or uint32 (nanoGPT's .bin
// layout), or raw bytes (uint8: any text file read with the byte-level tokenizer, where token id =
// byte value, vocabulary 256). `make-tokens` turns a text file into a uint16/uint32 file, and
// since issue 22 puts a header in front that records the tokenizer (docs/formats.md):
//
//   "EMBERTOK" | u32 LE json_bytes | u32 LE version (1) | JSON, space-padded so the ids start at a
//   multiple of 8 | the ids
//   JSON: {"version":1,"dtype":"uint16","tokens":N,
//          "tokenizer":{"kind":"sentencepiece","sha256":"<hex of the .model file>","vocab_size":V,
//                       "model":"<file name>"}}            (kind "bytes": vocab_size 256, no sha256)
//
// Open reads both: a uint16/uint32 file that starts with the magic has a header (an old headerless
// file whose first ids spell "EMBERTOK" would be misread; make-tokens --header=false writes none).
//
// The loader cuts the token stream (after `start_token`) into windows of T+1 tokens with stride T
// (inputs = window[0:T], targets = window[1:T+1]). Global sequence g (counted over the whole job,
// across ranks) is window perm_e(g mod W) of epoch e = g / W, where perm_e is an affine bijection
// (a*i + b) mod W seeded by (seed, e) (identity with shuffle off). A step's global batch is
// sequences [pos, pos + world*B); rank r reads [pos + r*B, pos + (r+1)*B). So the global batch does
// not depend on the world size, and `position` (sequences consumed) resumes at any world size.
//
// Thread safety: TokenFile is immutable after Open (safe to share); TokenLoader is
// thread-compatible.
//
//   ASSIGN_OR_RETURN(auto file, TokenFile::Open("data.bin", TokenDtype::kU16));
//   TokenLoader loader(file, {.seq_len = 128, .batch = 4, .rank = r, .world = n, .seed = 1});
//   RETURN_IF_ERROR(loader.Next(tokens, targets));   // tokens/targets: [B, T] int32
#ifndef EMBER_RUNTIME_DATA_TOKEN_FILE_H_
#define EMBER_RUNTIME_DATA_TOKEN_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::data {

enum class TokenDtype { kU8, kU16, kU32 };

// "uint8" | "uint16" | "uint32" (also "u8"...); InvalidArgument otherwise.
absl::StatusOr<TokenDtype> ParseTokenDtype(absl::string_view s);
size_t TokenDtypeSize(TokenDtype t);
const char* TokenDtypeName(TokenDtype t);  // "uint8" | "uint16" | "uint32"

// The tokenizer a token file was made with (its header); kind "" for a file without a header.
struct TokenizerInfo {
  std::string kind;    // "bytes" | "sentencepiece" | "" (unknown: no header)
  std::string sha256;  // sentencepiece: lowercase hex SHA-256 of the model file
  int64_t vocab_size = 0;
  std::string model;   // the model file's name when the file was made (informational)
  std::string Describe() const;  // "sentencepiece (sha256 ab12..., vocab 512, spm.model)"
};

inline constexpr char kTokenFileMagic[] = "EMBERTOK";
// The header make-tokens writes in front of `tokens` ids of `dtype` (a multiple of 8 bytes).
std::string TokenFileHeader(TokenDtype dtype, int64_t tokens, const TokenizerInfo& tok);

class TokenFile {
 public:
  // Memory-maps `path` read-only. NotFound names the path; InvalidArgument when the size is not a
  // multiple of the token size. A uint16/uint32 file with a header: its dtype must be `dtype` and
  // its size must match the header's token count (InvalidArgument naming both otherwise).
  static absl::StatusOr<std::shared_ptr<TokenFile>> Open(const std::string& path, TokenDtype dtype);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return n_; }  // tokens
  TokenDtype dtype() const { return dtype_; }
  const std::string& path() const { return path_; }
  uint32_t at(int64_t i) const;
  // Largest token id in the file (scans it once; cached).
  uint32_t max_token() const;
  // The header's tokenizer; kind "" when the file has none (and always for uint8 text files).
  const TokenizerInfo& tokenizer() const { return tokenizer_; }

 private:
  TokenFile() = default;
  std::string path_;
  TokenDtype dtype_ = TokenDtype::kU16;
  const uint8_t* map_ = nullptr;   // the whole file
  const uint8_t* data_ = nullptr;  // the ids (after the header, if any)
  size_t bytes_ = 0;               // of the whole file
  TokenizerInfo tokenizer_;
  int64_t n_ = 0;
  mutable int64_t max_ = -1;
};

struct LoaderOptions {
  int64_t seq_len = 128;   // T
  int64_t batch = 4;       // B: sequences per rank per call to Next
  int rank = 0;
  int world = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t start_token = 0;  // the stream starts here (DataConfig.start_position)
};

class TokenLoader {
 public:
  // FailedPrecondition-free constructor; call Validate() before use.
  TokenLoader(std::shared_ptr<const TokenFile> file, LoaderOptions opts);
  // InvalidArgument when the file holds fewer than T+1 tokens after start_token, or a bad option.
  absl::Status Validate() const;

  // Fills tokens/targets [B, T] (int32) with this rank's slice of the next global batch and
  // advances the position by world*B sequences.
  absl::Status Next(int32_t* tokens, int32_t* targets);

  int64_t position() const { return position_; }  // global sequences consumed
  int64_t windows() const;                          // W: windows per epoch
  // Opaque state for checkpoints ("position=<n> seq_len=<T> seed=<s>"); Restore accepts it at any
  // world size and batch, and rejects a different seq_len or seed (InvalidArgument).
  std::string SaveState() const;
  absl::Status RestoreState(absl::string_view state);
  // Window index (start token = start_token + w*T) of global sequence g.
  int64_t WindowOf(int64_t g) const;

 private:
  std::shared_ptr<const TokenFile> file_;
  LoaderOptions opts_;
  int64_t position_ = 0;
};

}  // namespace ember::data

#endif  // EMBER_RUNTIME_DATA_TOKEN_FILE_H_
