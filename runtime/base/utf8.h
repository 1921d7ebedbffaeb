// UTF-8 well-formedness (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
// Used where text must be valid UTF-8 (JSON strings, store keys). Pure functions; thread-safe.
//
//   if (size_t bad = base::FirstInvalidUtf8(key); bad != absl::string_view::npos) ...
#ifndef EMBER_RUNTIME_BASE_UTF8_H_
#define EMBER_RUNTIME_BASE_UTF8_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace ember::base {

// Length (1-4) of the well-formed UTF-8 sequence starting at s[pos] (pos < s.size()); 0 when the
// bytes there are not one (an invalid lead or continuation byte, an overlong form, a surrogate,
// a code point above U+10FFFF, or a sequence cut off by the end of s).
int Utf8SequenceLength(absl::string_view s, size_t pos);

// Offset of the first byte of s that does not start a well-formed sequence; npos when all of s is
// valid UTF-8.
size_t FirstInvalidUtf8(absl::string_view s);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_UTF8_H_
