// Test helper: a byte pattern that differs per position, rank and tag (so a shifted, truncated or
// misdirected transfer is caught), and its checker. Header-only, thread-compatible.
#ifndef EMBER_RUNTIME_ONESIDED_TEST_PATTERN_H_
#define EMBER_RUNTIME_ONESIDED_TEST_PATTERN_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace ember::onesided {

inline uint8_t PatternByte(uint64_t i, int rank, int tag) {
  uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u + static_cast<uint32_t>(i >> 32) * 0x27D4EB2Fu +
               static_cast<uint32_t>(rank) * 0x85EBCA77u + static_cast<uint32_t>(tag) * 0xC2B2AE3Du;
  return static_cast<uint8_t>((x >> 13) ^ (x >> 24) ^ x);
}

inline void FillPattern(uint8_t* p, uint64_t n, int rank, int tag) {
  for (uint64_t i = 0; i < n; ++i) p[i] = PatternByte(i, rank, tag);
}

// "" when buf[off, off + n) holds the pattern of (rank, tag) and every other byte of buf is 0xEE;
// otherwise the first difference.
inline std::string CheckPattern(const uint8_t* buf, uint64_t size, uint64_t off, uint64_t n, int rank,
                                int tag) {
  for (uint64_t i = 0; i < size; ++i) {
    const bool inside = i >= off && i - off < n;
    const uint8_t want = inside ? PatternByte(i - off, rank, tag) : 0xEE;
    if (buf[i] != want) {
      return absl::StrCat("byte ", i, " (", inside ? "data" : "guard", ") is ", int{buf[i]}, ", expected ",
                          int{want});
    }
  }
  return "";
}

}  // namespace ember::onesided

#endif  // EMBER_RUNTIME_ONESIDED_TEST_PATTERN_H_
