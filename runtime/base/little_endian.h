// Little-endian integer encoding for the project's binary framings (store log and fast path).
// Header-only, thread-compatible.
#ifndef EMBER_RUNTIME_BASE_LITTLE_ENDIAN_H_
#define EMBER_RUNTIME_BASE_LITTLE_ENDIAN_H_

#include <cstdint>
#include <string>

namespace ember::base {

inline void AppendU32LE(uint32_t v, std::string* out) {
  char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
               static_cast<char>(v >> 24)};
  out->append(b, 4);
}

// REQUIRES: p points at 4 readable bytes.
inline uint32_t LoadU32LE(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{u[0]} | uint32_t{u[1]} << 8 | uint32_t{u[2]} << 16 | uint32_t{u[3]} << 24;
}

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_LITTLE_ENDIAN_H_
