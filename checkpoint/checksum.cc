#include "checkpoint/checksum.h"

#include <xxhash.h>

#include "absl/strings/str_format.h"

namespace ember::ckpt {

uint64_t Xxh3(absl::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string HashHex(uint64_t h) { return absl::StrFormat("%016x", h); }

bool ParseHashHex(absl::string_view s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else return false;
  }
  *out = v;
  return true;
}

}  // namespace ember::ckpt
