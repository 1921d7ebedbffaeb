// Chunk checksums: XXH3-64 (libxxhash), written in metadata as 16 lowercase hex digits.
// Pure functions: thread-safe.
#ifndef EMBER_CHECKPOINT_CHECKSUM_H_
#define EMBER_CHECKPOINT_CHECKSUM_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ember::ckpt {

uint64_t Xxh3(absl::string_view bytes);

// Incremental XXH3-64: Update() over consecutive pieces gives the same digest as Xxh3() over their
// concatenation, so a chunk can be checked without holding it in memory. Thread-compatible.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Update(absl::string_view bytes);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t
};
std::string HashHex(uint64_t h);           // "%016x"
bool ParseHashHex(absl::string_view s, uint64_t* out);  // exactly 16 hex digits

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_CHECKSUM_H_
