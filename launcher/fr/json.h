// A small JSON reader for flight-recorder dumps (objects, arrays, strings, numbers, bools, null).
// Thread-compatible; values are plain trees.
#ifndef EMBER_LAUNCHER_FR_JSON_H_
#define EMBER_LAUNCHER_FR_JSON_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::fr {

struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool b = false;
  double num = 0;
  int64_t i = 0;  // exact value for integers
  std::string str;
  std::vector<Json> arr;
  std::map<std::string, Json> obj;

  // Member access; a missing key yields a null value.
  const Json& operator[](const std::string& key) const;
  int64_t Int(int64_t def = 0) const { return type == Type::kNumber ? i : def; }
  std::string Str() const { return type == Type::kString ? str : ""; }
};

absl::StatusOr<Json> ParseJson(absl::string_view text);

}  // namespace ember::fr

#endif  // EMBER_LAUNCHER_FR_JSON_H_
