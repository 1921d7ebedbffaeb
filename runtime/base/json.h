// A small, strict JSON value, parser and writer: checkpoint metadata, safetensors headers,
// flight-recorder dumps.
//
//   ASSIGN_OR_RETURN(json::Value v, json::Parse(text));          // bounded, strict RFC 8259
//   const json::Value* shape = v.Find("shape");                  // nullptr if absent
//   std::string out = json::Write(v);                            // compact, keys in insertion order
//
// Strictness: no comments, no trailing commas, no NaN/Infinity, no leading zeros, strings must be
// valid UTF-8 with control characters escaped, duplicate object keys are rejected, nesting is
// limited to kMaxDepth. Integers without fraction/exponent that fit in int64 are kept exactly (file
// offsets need all 64 bits); other numbers are doubles. Errors are INVALID_ARGUMENT naming the byte
// offset. Values are plain data: thread-compatible.
#ifndef EMBER_RUNTIME_BASE_JSON_H_
#define EMBER_RUNTIME_BASE_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::json {

inline constexpr int kMaxDepth = 64;

class Value {
 public:
  enum class Type { kNull, kBool, kInt, kDouble, kString, kArray, kObject };
  using Object = std::vector<std::pair<std::string, Value>>;
  using Array = std::vector<Value>;

  Value() = default;
  static Value Bool(bool b) { Value v; v.type_ = Type::kBool; v.bool_ = b; return v; }
  static Value Int(int64_t i) { Value v; v.type_ = Type::kInt; v.int_ = i; return v; }
  static Value Double(double d) { Value v; v.type_ = Type::kDouble; v.double_ = d; return v; }
  static Value Str(std::string s) { Value v; v.type_ = Type::kString; v.str_ = std::move(s); return v; }
  static Value MakeArray() { Value v; v.type_ = Type::kArray; return v; }
  static Value MakeObject() { Value v; v.type_ = Type::kObject; return v; }

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kDouble; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // REQUIRES: the matching type.
  bool as_bool() const { return bool_; }
  int64_t as_int() const { return int_; }
  double as_double() const { return type_ == Type::kInt ? static_cast<double>(int_) : double_; }
  const std::string& as_string() const { return str_; }
  const Array& array() const { return array_; }
  Array& array() { return array_; }
  const Object& object() const { return object_; }
  Object& object() { return object_; }

  // Object lookup (linear); nullptr if absent or not an object.
  const Value* Find(absl::string_view key) const;
  // Lenient accessors for reading documents whose fields may be missing: a missing key gives a
  // null Value; IntOr/StrOr return the default when the type does not match.
  const Value& Get(absl::string_view key) const;
  int64_t IntOr(int64_t def) const {
    return type_ == Type::kInt ? int_ : type_ == Type::kDouble ? static_cast<int64_t>(double_) : def;
  }
  std::string StrOr(std::string def = "") const { return type_ == Type::kString ? str_ : def; }
  // Object append (no duplicate check; the writer's caller keeps keys unique). Returns *this.
  Value& Set(std::string key, Value v);
  Value& Push(Value v);

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string str_;
  Array array_;
  Object object_;
};

// Parses exactly one JSON value; trailing whitespace is allowed, anything else is an error.
absl::StatusOr<Value> Parse(absl::string_view text);

// Compact serialization (no spaces). `indent` > 0 pretty-prints with that many spaces.
std::string Write(const Value& v, int indent = 0);

// Typed accessors with errors that name `what` (e.g. "tensor 'w' field 'shape'").
absl::StatusOr<int64_t> GetInt(const Value& obj, absl::string_view key, absl::string_view what);
absl::StatusOr<std::string> GetString(const Value& obj, absl::string_view key,
                                      absl::string_view what);
absl::StatusOr<const Value*> GetField(const Value& obj, absl::string_view key, Value::Type type,
                                      absl::string_view what);

}  // namespace ember::json

#endif  // EMBER_RUNTIME_BASE_JSON_H_
