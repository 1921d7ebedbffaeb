#include "checkpoint/checksum.h"

#include <xxhash.h>

#include "absl/strings/str_format.h"

namespace ember::ckpt {

uint64_t Xxh3(absl::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3Stream::Update(absl::string_view bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}

uint64_t Xxh3Stream::Digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

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
