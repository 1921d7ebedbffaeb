#include "runtime/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/json.h"

namespace ember::data {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

absl::StatusOr<TokenDtype> ParseTokenDtype(absl::string_view s) {
  if (s == "uint8" || s == "u8") return TokenDtype::kU8;
  if (s == "uint16" || s == "u16") return TokenDtype::kU16;
  if (s == "uint32" || s == "u32") return TokenDtype::kU32;
  return absl::InvalidArgumentError(
      absl::StrCat("token dtype '", s, "' is not allowed; use one of uint8, uint16, uint32"));
}

const char* TokenDtypeName(TokenDtype t) {
  switch (t) {
    case TokenDtype::kU8: return "uint8";
    case TokenDtype::kU16: return "uint16";
    case TokenDtype::kU32: return "uint32";
  }
  return "?";
}

std::string TokenizerInfo::Describe() const {
  if (kind.empty()) return "unknown (no header)";
  std::string out = absl::StrCat(kind, " (");
  if (!sha256.empty()) absl::StrAppend(&out, "sha256 ", sha256.substr(0, 12), "..., ");
  absl::StrAppend(&out, "vocab ", vocab_size);
  if (!model.empty()) absl::StrAppend(&out, ", ", model);
  return out + ")";
}

std::string TokenFileHeader(TokenDtype dtype, int64_t tokens, const TokenizerInfo& tok) {
  json::Value t = json::Value::MakeObject();
  t.Set("kind", json::Value::Str(tok.kind));
  if (!tok.sha256.empty()) t.Set("sha256", json::Value::Str(tok.sha256));
  t.Set("vocab_size", json::Value::Int(tok.vocab_size));
  if (!tok.model.empty()) t.Set("model", json::Value::Str(tok.model));
  json::Value h = json::Value::MakeObject();
  h.Set("version", json::Value::Int(1));
  h.Set("dtype", json::Value::Str(TokenDtypeName(dtype)));
  h.Set("tokens", json::Value::Int(tokens));
  h.Set("tokenizer", std::move(t));
  std::string text = json::Write(h);
  text.append((8 - (16 + text.size()) % 8) % 8, ' ');
  std::string out(kTokenFileMagic, 8);
  for (uint32_t v : {static_cast<uint32_t>(text.size()), 1u}) {
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
  }
  return out + text;
}

namespace {

// Parses the header at the front of `file` (which starts with the magic): the ids' offset, count
// and the tokenizer. `path` names the file in errors.
absl::Status ParseHeader(const std::string& path, const uint8_t* file, size_t bytes, TokenDtype want,
                         size_t* offset, int64_t* tokens, TokenizerInfo* tok) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "': header: ", why));
  };
  if (bytes < 16) return bad("truncated");
  uint32_t len = 0, version = 0;
  for (int b = 3; b >= 0; --b) {
    len = (len << 8) | file[8 + b];
    version = (version << 8) | file[12 + b];
  }
  if (version != 1) return bad(absl::StrCat("version ", version, "; this Ember reads version 1"));
  if (len > bytes - 16 || len > (1u << 20)) return bad(absl::StrCat("length ", len, " exceeds the file"));
  auto h = json::Parse(absl::string_view(reinterpret_cast<const char*>(file + 16), len));
  if (!h.ok()) return bad(std::string(h.status().message()));
  const std::string dtype = h->Get("dtype").StrOr();
  if (dtype != TokenDtypeName(want)) {
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "' holds ", dtype,
                                                   " ids (its header), data.token_dtype is ", TokenDtypeName(want),
                                                   "; set data.token_dtype: ", dtype));
  }
  *offset = 16 + len;
  *tokens = h->Get("tokens").IntOr(-1);
  if (*tokens < 0 || static_cast<uint64_t>(*tokens) * TokenDtypeSize(want) != bytes - *offset) {
    return bad(absl::StrCat(*tokens, " tokens promised, ", bytes - *offset, " bytes of ids follow (truncated?)"));
  }
  const json::Value& t = h->Get("tokenizer");
  tok->kind = t.Get("kind").StrOr();
  tok->sha256 = t.Get("sha256").StrOr();
  tok->vocab_size = t.Get("vocab_size").IntOr(0);
  tok->model = t.Get("model").StrOr();
  if (tok->kind.empty() || tok->vocab_size <= 0) return bad("tokenizer needs kind and a positive vocab_size");
  return absl::OkStatus();
}

}  // namespace

size_t TokenDtypeSize(TokenDtype t) {
  switch (t) {
    case TokenDtype::kU8: return 1;
    case TokenDtype::kU16: return 2;
    case TokenDtype::kU32: return 4;
  }
  return 0;
}

absl::StatusOr<std::shared_ptr<TokenFile>> TokenFile::Open(const std::string& path,
                                                           TokenDtype dtype) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::string why = std::strerror(errno);
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("token file '", path, "': ", why));
    return absl::PermissionDeniedError(absl::StrCat("token file '", path, "': ", why));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("stat '", path, "': ", std::strerror(errno)));
  }
  std::shared_ptr<TokenFile> f(new TokenFile());
  f->path_ = path;
  f->dtype_ = dtype;
  f->bytes_ = static_cast<size_t>(st.st_size);
  const bool header = dtype != TokenDtype::kU8 && f->bytes_ >= 8 && [&] {
    char magic[8];
    return ::pread(fd, magic, 8, 0) == 8 && std::memcmp(magic, kTokenFileMagic, 8) == 0;
  }();
  if (!header && f->bytes_ % TokenDtypeSize(dtype) != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "' has ", f->bytes_,
                                                   " bytes, not a multiple of ",
                                                   TokenDtypeSize(dtype)));
  }
  if (f->bytes_ > 0) {
    void* p = mmap(nullptr, f->bytes_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("mmap '", path, "': ", std::strerror(errno)));
    }
    f->map_ = f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  f->n_ = static_cast<int64_t>(f->bytes_ / TokenDtypeSize(dtype));
  if (header) {
    size_t offset = 0;
    if (absl::Status s = ParseHeader(path, f->map_, f->bytes_, dtype, &offset, &f->n_, &f->tokenizer_); !s.ok()) {
      return s;
    }
    f->data_ = f->map_ + offset;
  }
  return f;
}

TokenFile::~TokenFile() {
  if (map_) munmap(const_cast<uint8_t*>(map_), bytes_);
}

uint32_t TokenFile::at(int64_t i) const {
  switch (dtype_) {
    case TokenDtype::kU8: return data_[i];
    case TokenDtype::kU16: {
      uint16_t v;
      std::memcpy(&v, data_ + 2 * i, 2);
      return v;
    }
    case TokenDtype::kU32: {
      uint32_t v;
      std::memcpy(&v, data_ + 4 * i, 4);
      return v;
    }
  }
  return 0;
}

uint32_t TokenFile::max_token() const {
  if (max_ < 0) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n_; ++i) m = std::max(m, at(i));
    max_ = m;
  }
  return static_cast<uint32_t>(max_);
}

TokenLoader::TokenLoader(std::shared_ptr<const TokenFile> file, LoaderOptions opts)
    : file_(std::move(file)), opts_(opts) {}

int64_t TokenLoader::windows() const {
  const int64_t avail = file_->size() - opts_.start_token;
  return avail < opts_.seq_len + 1 ? 0 : (avail - 1) / opts_.seq_len;
}

absl::Status TokenLoader::Validate() const {
  if (opts_.seq_len <= 0 || opts_.batch <= 0 || opts_.world <= 0 || opts_.rank < 0 ||
      opts_.rank >= opts_.world || opts_.start_token < 0) {
    return absl::InvalidArgumentError(absl::StrCat("loader options: seq_len ", opts_.seq_len,
                                                   ", batch ", opts_.batch, ", rank ", opts_.rank,
                                                   "/", opts_.world, ", start ", opts_.start_token));
  }
  if (windows() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file '", file_->path(), "' has ", file_->size(), " tokens; need at least ",
        opts_.start_token + opts_.seq_len + 1, " (start_position + context + 1)"));
  }
  return absl::OkStatus();
}

int64_t TokenLoader::WindowOf(int64_t g) const {
  const int64_t W = windows();
  const int64_t e = g / W, i = g % W;
  if (!opts_.shuffle || W == 1) return i;
  const uint64_t h = SplitMix64(SplitMix64(opts_.seed) ^ static_cast<uint64_t>(e));
  int64_t a = static_cast<int64_t>(h % static_cast<uint64_t>(W));
  if (a == 0) a = 1;
  while (std::gcd(a, W) != 1) a = a + 1 < W ? a + 1 : 1;  // gcd(1, W) = 1 ends the loop
  const int64_t b = static_cast<int64_t>(SplitMix64(h) % static_cast<uint64_t>(W));
  return static_cast<int64_t>((static_cast<__int128>(a) * i + b) % W);
}

absl::Status TokenLoader::Next(int32_t* tokens, int32_t* targets) {
  const int64_t T = opts_.seq_len, B = opts_.batch;
  for (int64_t j = 0; j < B; ++j) {
    const int64_t g = position_ + static_cast<int64_t>(opts_.rank) * B + j;
    const int64_t start = opts_.start_token + WindowOf(g) * T;
    for (int64_t t = 0; t < T; ++t) {
      tokens[j * T + t] = static_cast<int32_t>(file_->at(start + t));
      targets[j * T + t] = static_cast<int32_t>(file_->at(start + t + 1));
    }
  }
  position_ += static_cast<int64_t>(opts_.world) * B;
  return absl::OkStatus();
}

std::string TokenLoader::SaveState() const {
  return absl::StrCat("position=", position_, " seq_len=", opts_.seq_len, " seed=", opts_.seed);
}

absl::Status TokenLoader::RestoreState(absl::string_view state) {
  int64_t pos = -1, T = -1;
  uint64_t seed = 0;
  bool have_seed = false;
  for (absl::string_view kv : absl::StrSplit(state, ' ', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(kv, '=');
    bool ok = true;
    if (p.first == "position") ok = absl::SimpleAtoi(p.second, &pos);
    else if (p.first == "seq_len") ok = absl::SimpleAtoi(p.second, &T);
    else if (p.first == "seed") ok = have_seed = absl::SimpleAtoi(p.second, &seed);
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("data loader state: bad '", kv, "'"));
  }
  if (pos < 0) return absl::InvalidArgumentError(absl::StrCat("data loader state '", state, "' has no position"));
  if (T != opts_.seq_len || (have_seed && seed != opts_.seed)) {
    return absl::InvalidArgumentError(absl::StrCat("data loader state '", state,
                                                   "' is for another seq_len/seed (now seq_len=",
                                                   opts_.seq_len, " seed=", opts_.seed, ")"));
  }
  position_ = pos;
  return absl::OkStatus();
}

}  // namespace ember::data
