#include "runtime/base/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/utf8.h"

namespace ember::json {
namespace {

class Parser {
 public:
  explicit Parser(absl::string_view s) : s_(s) {}

  absl::StatusOr<Value> ParseAll() {
    Value v;
    absl::Status st = ParseValue(0, &v);
    if (!st.ok()) return st;
    SkipWs();
    if (pos_ != s_.size()) return Error("trailing characters after the JSON value");
    return v;
  }

 private:
  absl::Status Error(absl::string_view msg) const {
    return absl::InvalidArgumentError(absl::StrCat("JSON: ", msg, " at byte ", pos_));
  }
  void SkipWs() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(absl::string_view lit) {
    if (s_.substr(pos_, lit.size()) == lit) { pos_ += lit.size(); return true; }
    return false;
  }

  absl::Status ParseValue(int depth, Value* out) {
    if (depth > kMaxDepth) return Error("nesting deeper than the limit");
    SkipWs();
    if (pos_ >= s_.size()) return Error("unexpected end of input");
    char c = s_[pos_];
    if (c == '{') return ParseObject(depth, out);
    if (c == '[') return ParseArray(depth, out);
    if (c == '"') {
      std::string str;
      absl::Status st = ParseString(&str);
      if (!st.ok()) return st;
      *out = Value::Str(std::move(str));
      return absl::OkStatus();
    }
    if (Consume("true")) { *out = Value::Bool(true); return absl::OkStatus(); }
    if (Consume("false")) { *out = Value::Bool(false); return absl::OkStatus(); }
    if (Consume("null")) { *out = Value(); return absl::OkStatus(); }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    return Error(absl::StrFormat("unexpected character 0x%02x", static_cast<unsigned char>(c)));
  }

  absl::Status ParseObject(int depth, Value* out) {
    ++pos_;  // '{'
    *out = Value::MakeObject();
    absl::flat_hash_set<std::string> seen;
    SkipWs();
    if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return absl::OkStatus(); }
    while (true) {
      SkipWs();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Error("expected a string key");
      std::string key;
      absl::Status st = ParseString(&key);
      if (!st.ok()) return st;
      if (!seen.insert(key).second) return Error(absl::StrCat("duplicate key \"", key, "\""));
      SkipWs();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Error("expected ':'");
      ++pos_;
      Value v;
      st = ParseValue(depth + 1, &v);
      if (!st.ok()) return st;
      out->object().emplace_back(std::move(key), std::move(v));
      SkipWs();
      if (pos_ >= s_.size()) return Error("unterminated object");
      if (s_[pos_] == ',') { ++pos_; continue; }
      if (s_[pos_] == '}') { ++pos_; return absl::OkStatus(); }
      return Error("expected ',' or '}'");
    }
  }

  absl::Status ParseArray(int depth, Value* out) {
    ++pos_;  // '['
    *out = Value::MakeArray();
    SkipWs();
    if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return absl::OkStatus(); }
    while (true) {
      Value v;
      absl::Status st = ParseValue(depth + 1, &v);
      if (!st.ok()) return st;
      out->array().push_back(std::move(v));
      SkipWs();
      if (pos_ >= s_.size()) return Error("unterminated array");
      if (s_[pos_] == ',') { ++pos_; continue; }
      if (s_[pos_] == ']') { ++pos_; return absl::OkStatus(); }
      return Error("expected ',' or ']'");
    }
  }

  absl::Status ParseNumber(Value* out) {
    size_t start = pos_;
    bool integral = true;
    if (s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size()) return Error("truncated number");
    if (s_[pos_] == '0') {
      ++pos_;
    } else if (s_[pos_] >= '1' && s_[pos_] <= '9') {
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    } else {
      return Error("bad number");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      integral = false;
      ++pos_;
      size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (d == pos_) return Error("bad fraction");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (d == pos_) return Error("bad exponent");
    }
    absl::string_view text = s_.substr(start, pos_ - start);
    if (integral) {
      int64_t i;
      if (absl::SimpleAtoi(text, &i)) { *out = Value::Int(i); return absl::OkStatus(); }
    }
    double d;
    if (!absl::SimpleAtod(text, &d) || !std::isfinite(d)) return Error("number out of range");
    *out = Value::Double(d);
    return absl::OkStatus();
  }

  absl::Status ParseHex4(uint32_t* cp) {
    if (s_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else return Error("bad \\u escape");
    }
    *cp = v;
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // Validates one UTF-8 sequence starting at pos_ (first byte >= 0x80) and appends it.
  absl::Status ParseUtf8(std::string* out) {
    const int n = base::Utf8SequenceLength(s_, pos_);
    if (n == 0) return Error("invalid UTF-8");
    out->append(s_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      if (pos_ >= s_.size()) return Error("unterminated string");
      unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') { ++pos_; return absl::OkStatus(); }
      if (c < 0x20) return Error("unescaped control character in string");
      if (c >= 0x80) {
        absl::Status st = ParseUtf8(out);
        if (!st.ok()) return st;
        continue;
      }
      if (c != '\\') { out->push_back(static_cast<char>(c)); ++pos_; continue; }
      ++pos_;
      if (pos_ >= s_.size()) return Error("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          absl::Status st = ParseHex4(&cp);
          if (!st.ok()) return st;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!Consume("\\u")) return Error("unpaired surrogate");
            uint32_t lo;
            st = ParseHex4(&lo);
            if (!st.ok()) return st;
            if (lo < 0xDC00 || lo > 0xDFFF) return Error("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Error("unpaired surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Error("bad escape");
      }
    }
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

void WriteString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void WriteValue(const Value& v, int indent, int level, std::string* out) {
  auto newline = [&](int l) {
    if (indent <= 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * l), ' ');
  };
  switch (v.type()) {
    case Value::Type::kNull: out->append("null"); break;
    case Value::Type::kBool: out->append(v.as_bool() ? "true" : "false"); break;
    case Value::Type::kInt: absl::StrAppend(out, v.as_int()); break;
    case Value::Type::kDouble: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.17g", v.as_double());
      out->append(buf);
      break;
    }
    case Value::Type::kString: WriteString(v.as_string(), out); break;
    case Value::Type::kArray: {
      out->push_back('[');
      bool first = true;
      for (const Value& e : v.array()) {
        if (!first) out->push_back(',');
        first = false;
        newline(level + 1);
        WriteValue(e, indent, level + 1, out);
      }
      if (!v.array().empty()) newline(level);
      out->push_back(']');
      break;
    }
    case Value::Type::kObject: {
      out->push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.object()) {
        if (!first) out->push_back(',');
        first = false;
        newline(level + 1);
        WriteString(k, out);
        out->push_back(':');
        if (indent > 0) out->push_back(' ');
        WriteValue(e, indent, level + 1, out);
      }
      if (!v.object().empty()) newline(level);
      out->push_back('}');
      break;
    }
  }
}

}  // namespace

const Value& Value::Get(absl::string_view key) const {
  static const Value* const kNull = new Value();
  const Value* v = Find(key);
  return v ? *v : *kNull;
}

const Value* Value::Find(absl::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& [k, v] : object_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value& Value::Set(std::string key, Value v) {
  object_.emplace_back(std::move(key), std::move(v));
  return *this;
}

Value& Value::Push(Value v) {
  array_.push_back(std::move(v));
  return *this;
}

absl::StatusOr<Value> Parse(absl::string_view text) { return Parser(text).ParseAll(); }

std::string Write(const Value& v, int indent) {
  std::string out;
  WriteValue(v, indent, 0, &out);
  return out;
}

absl::StatusOr<const Value*> GetField(const Value& obj, absl::string_view key, Value::Type type,
                                      absl::string_view what) {
  const Value* v = obj.Find(key);
  if (v == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": missing field \"", key, "\""));
  }
  if (v->type() != type) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": field \"", key, "\" has the wrong type"));
  }
  return v;
}

absl::StatusOr<int64_t> GetInt(const Value& obj, absl::string_view key, absl::string_view what) {
  absl::StatusOr<const Value*> v = GetField(obj, key, Value::Type::kInt, what);
  if (!v.ok()) return v.status();
  return (*v)->as_int();
}

absl::StatusOr<std::string> GetString(const Value& obj, absl::string_view key,
                                      absl::string_view what) {
  absl::StatusOr<const Value*> v = GetField(obj, key, Value::Type::kString, what);
  if (!v.ok()) return v.status();
  return (*v)->as_string();
}

}  // namespace ember::json
