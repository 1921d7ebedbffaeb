// Chunk checksums: XXH3-64 (libxxhash), written in metadata as 16 lowercase hex digits.
// Pure functions: thread-safe.
#ifndef EMBER_CHECKPOINT_CHECKSUM_H_
#define EMBER_CHECKPOINT_CHECKSUM_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ember::ckpt {

uint64_t Xxh3(absl::string_view bytes);
std::string HashHex(uint64_t h);           // "%016x"
bool ParseHashHex(absl::string_view s, uint64_t* out);  // exactly 16 hex digits

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_CHECKSUM_H_
