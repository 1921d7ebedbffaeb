#include "runtime/base/utf8.h"

#include <cstdint>

namespace ember::base {

int Utf8SequenceLength(absl::string_view s, size_t pos) {
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return 1;
  int n;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) { n = 1; cp = c & 0x1F; }
  else if (c >= 0xE0 && c <= 0xEF) { n = 2; cp = c & 0x0F; }
  else if (c >= 0xF0 && c <= 0xF4) { n = 3; cp = c & 0x07; }
  else return 0;
  if (s.size() - pos <= static_cast<size_t>(n)) return 0;
  for (int i = 1; i <= n; ++i) {
    const unsigned char cc = static_cast<unsigned char>(s[pos + i]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n + 1;
}

size_t FirstInvalidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = Utf8SequenceLength(s, i);
    if (n == 0) return i;
    i += n;
  }
  return absl::string_view::npos;
}

}  // namespace ember::base
