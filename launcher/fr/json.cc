#include "launcher/fr/json.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace ember::fr {
namespace {

class Parser {
 public:
  explicit Parser(absl::string_view s) : s_(s) {}
  absl::StatusOr<Json> Parse() {
    Json v;
    if (!Value(&v, 0)) return Error();
    Ws();
    if (p_ != s_.size()) { err_ = "trailing characters"; return Error(); }
    return v;
  }

 private:
  absl::Status Error() {
    return absl::InvalidArgumentError(absl::StrCat("JSON parse error at offset ", p_, ": ", err_));
  }
  void Ws() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\n' || s_[p_] == '\t' || s_[p_] == '\r')) ++p_;
  }
  bool Lit(absl::string_view w) {
    if (s_.substr(p_, w.size()) != w) { err_ = "bad literal"; return false; }
    p_ += w.size();
    return true;
  }
  bool Value(Json* v, int depth) {
    if (depth > 64) { err_ = "too deep"; return false; }
    Ws();
    if (p_ >= s_.size()) { err_ = "unexpected end"; return false; }
    char c = s_[p_];
    if (c == '{') {
      v->type = Json::Type::kObject;
      ++p_;
      Ws();
      if (p_ < s_.size() && s_[p_] == '}') { ++p_; return true; }
      while (true) {
        Ws();
        std::string key;
        if (!String(&key)) return false;
        Ws();
        if (p_ >= s_.size() || s_[p_] != ':') { err_ = "expected ':'"; return false; }
        ++p_;
        if (!Value(&v->obj[key], depth + 1)) return false;
        Ws();
        if (p_ < s_.size() && s_[p_] == ',') { ++p_; continue; }
        if (p_ < s_.size() && s_[p_] == '}') { ++p_; return true; }
        err_ = "expected ',' or '}'";
        return false;
      }
    }
    if (c == '[') {
      v->type = Json::Type::kArray;
      ++p_;
      Ws();
      if (p_ < s_.size() && s_[p_] == ']') { ++p_; return true; }
      while (true) {
        v->arr.emplace_back();
        if (!Value(&v->arr.back(), depth + 1)) return false;
        Ws();
        if (p_ < s_.size() && s_[p_] == ',') { ++p_; continue; }
        if (p_ < s_.size() && s_[p_] == ']') { ++p_; return true; }
        err_ = "expected ',' or ']'";
        return false;
      }
    }
    if (c == '"') { v->type = Json::Type::kString; return String(&v->str); }
    if (c == 't') { v->type = Json::Type::kBool; v->b = true; return Lit("true"); }
    if (c == 'f') { v->type = Json::Type::kBool; return Lit("false"); }
    if (c == 'n') return Lit("null");
    size_t start = p_;
    if (s_[p_] == '-') ++p_;
    bool integral = true;
    while (p_ < s_.size() && (isdigit(static_cast<unsigned char>(s_[p_])) || s_[p_] == '.' ||
                              s_[p_] == 'e' || s_[p_] == 'E' || s_[p_] == '+' || s_[p_] == '-')) {
      if (!isdigit(static_cast<unsigned char>(s_[p_]))) integral = false;
      ++p_;
    }
    if (p_ == start) { err_ = "unexpected character"; return false; }
    std::string num(s_.substr(start, p_ - start));
    v->type = Json::Type::kNumber;
    v->num = std::strtod(num.c_str(), nullptr);
    v->i = integral ? std::strtoll(num.c_str(), nullptr, 10) : static_cast<int64_t>(v->num);
    return true;
  }
  bool String(std::string* out) {
    if (p_ >= s_.size() || s_[p_] != '"') { err_ = "expected string"; return false; }
    ++p_;
    while (p_ < s_.size() && s_[p_] != '"') {
      char c = s_[p_++];
      if (c != '\\') { out->push_back(c); continue; }
      if (p_ >= s_.size()) break;
      char e = s_[p_++];
      switch (e) {
        case 'n': out->push_back('\n'); break;
        case 't': out->push_back('\t'); break;
        case 'r': out->push_back('\r'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'u': {
          if (p_ + 4 > s_.size()) { err_ = "bad escape"; return false; }
          unsigned cp = std::strtoul(std::string(s_.substr(p_, 4)).c_str(), nullptr, 16);
          p_ += 4;
          if (cp < 0x80) out->push_back(static_cast<char>(cp));
          else if (cp < 0x800) { out->push_back(0xc0 | (cp >> 6)); out->push_back(0x80 | (cp & 0x3f)); }
          else { out->push_back(0xe0 | (cp >> 12)); out->push_back(0x80 | ((cp >> 6) & 0x3f)); out->push_back(0x80 | (cp & 0x3f)); }
          break;
        }
        default: out->push_back(e);
      }
    }
    if (p_ >= s_.size()) { err_ = "unterminated string"; return false; }
    ++p_;
    return true;
  }
  absl::string_view s_;
  size_t p_ = 0;
  std::string err_;
};

}  // namespace

const Json& Json::operator[](const std::string& key) const {
  static const Json kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : it->second;
}

absl::StatusOr<Json> ParseJson(absl::string_view text) { return Parser(text).Parse(); }

}  // namespace ember::fr
