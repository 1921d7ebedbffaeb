#include "runtime/jobspec/yaml_proto.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/reflection.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/utf8.h"

namespace ember::spec {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Errors start with the field path, or `root` (the document's name) when there is none.
absl::Status Bad(const std::string& root, const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path.empty() ? root : path, ": ", what));
}

std::string Join(const std::string& path, const std::string& name) {
  return path.empty() ? name : absl::StrCat(path, ".", name);
}

std::string Allowed(const google::protobuf::Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return absl::StrJoin(names, ", ");
}

// NaN and infinities (YAML .nan, .inf; or a float literal beyond the float range) are refused in
// every float field.
absl::Status NotFinite(const std::string& root, const std::string& path,
                       const std::string& text) {
  return Bad(root, path, absl::StrCat("'", text, "' is not a finite number"));
}

absl::Status SetScalar(const YAML::Node& node, const FieldDescriptor* f, Message* msg,
                       const std::string& root, const std::string& path, bool repeated) {
  if (!node.IsScalar()) return Bad(root, path, "expected a single value, got a list or mapping");
  const Reflection* r = msg->GetReflection();
  std::string text = node.Scalar();
  try {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        // Proto strings are UTF-8 (a record with other bytes does not serialize), and YAML text
        // cannot carry other bytes back (ToYaml): refused here, where the field can be named.
        if (const size_t bad = base::FirstInvalidUtf8(text); bad != std::string::npos) {
          return Bad(root, path, absl::StrCat("not valid UTF-8 (byte ", bad, ")"));
        }
        repeated ? r->AddString(msg, f, text) : r->SetString(msg, f, text);
        return absl::OkStatus();
      case FieldDescriptor::CPPTYPE_BOOL: {
        bool v = node.as<bool>();
        repeated ? r->AddBool(msg, f, v) : r->SetBool(msg, f, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_INT32: {
        int32_t v = node.as<int32_t>();
        repeated ? r->AddInt32(msg, f, v) : r->SetInt32(msg, f, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t v = node.as<int64_t>();
        repeated ? r->AddInt64(msg, f, v) : r->SetInt64(msg, f, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_FLOAT: {
        float v = node.as<float>();
        if (!std::isfinite(v)) return NotFinite(root, path, text);
        repeated ? r->AddFloat(msg, f, v) : r->SetFloat(msg, f, v);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        double v = node.as<double>();
        if (!std::isfinite(v)) return NotFinite(root, path, text);
        repeated ? r->AddDouble(msg, f, v) : r->SetDouble(msg, f, v);
        return absl::OkStatus();
      }
      default:
        return Bad(root, path, "unsupported field type");
    }
  } catch (const YAML::Exception&) {
    return Bad(root, path, absl::StrCat("'", text, "' is not a valid ", f->cpp_type_name()));
  }
}

absl::Status FillMessage(const YAML::Node& node, Message* msg, const std::string& root,
                         const std::string& path, int depth) {
  if (depth > 8) return Bad(root, path, "nested too deeply");
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) return Bad(root, path, "expected a mapping of field: value");
  const auto* desc = msg->GetDescriptor();
  const Reflection* r = msg->GetReflection();
  std::set<std::string> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) return Bad(root, path, "keys must be plain names");
    std::string key = kv.first.Scalar();
    std::string fpath = Join(path, key);
    // yaml-cpp keeps every entry of a mapping, so without this check the last of two equal keys
    // would silently win.
    if (!seen.insert(key).second) {
      return Bad(root, fpath, absl::StrCat("duplicate key on line ", kv.first.Mark().line + 1,
                                     "; each field may appear once"));
    }
    const FieldDescriptor* f = desc->FindFieldByName(key);
    if (f == nullptr) {
      return Bad(root, fpath, absl::StrCat("unknown field; allowed here: ", Allowed(desc)));
    }
    const YAML::Node& v = kv.second;
    if (f->is_map()) {  // a YAML mapping of scalar -> scalar (map<string, string> fields)
      if (v.IsNull()) continue;
      if (!v.IsMap()) return Bad(root, fpath, "expected a mapping of name: value");
      if (v.size() > 1024) return Bad(root, fpath, "more than 1024 entries");
      std::set<std::string> names;
      for (const auto& e : v) {
        if (!e.first.IsScalar()) return Bad(root, fpath, "keys must be plain names");
        const std::string epath = Join(fpath, e.first.Scalar());
        if (!names.insert(e.first.Scalar()).second) {
          return Bad(root, epath, absl::StrCat("duplicate key on line ", e.first.Mark().line + 1));
        }
        Message* entry = r->AddMessage(msg, f);
        const auto* ed = entry->GetDescriptor();
        RETURN_IF_ERROR(SetScalar(e.first, ed->FindFieldByName("key"), entry, root, epath, false));
        RETURN_IF_ERROR(SetScalar(e.second, ed->FindFieldByName("value"), entry, root, epath, false));
      }
    } else if (f->is_repeated()) {
      if (v.IsNull()) continue;
      if (!v.IsSequence()) return Bad(root, fpath, "expected a list");
      if (v.size() > 1024) return Bad(root, fpath, "more than 1024 entries");
      for (size_t i = 0; i < v.size(); ++i) {
        std::string ipath = absl::StrCat(fpath, "[", i, "]");
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          RETURN_IF_ERROR(FillMessage(v[i], r->AddMessage(msg, f), root, ipath, depth + 1));
        } else {
          RETURN_IF_ERROR(SetScalar(v[i], f, msg, root, ipath, true));
        }
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      RETURN_IF_ERROR(FillMessage(v, r->MutableMessage(msg, f), root, fpath, depth + 1));
    } else {
      RETURN_IF_ERROR(SetScalar(v, f, msg, root, fpath, false));
    }
  }
  return absl::OkStatus();
}

void EmitScalar(YAML::Emitter& out, const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      out << YAML::DoubleQuoted << (rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out << ((rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f)) ? "true" : "false");
      break;
    case FieldDescriptor::CPPTYPE_INT32:
      out << absl::StrCat(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      out << absl::StrCat(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:  // 9 significant digits read back to the same float
      out << absl::StrFormat("%.9g", rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      out << absl::StrFormat("%.17g", rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
      break;
    default:
      out << YAML::Null;
      break;
  }
}

void EmitMessage(YAML::Emitter& out, const Message& m) {
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);  // the set ones, by field number
  out << YAML::BeginMap;
  for (const FieldDescriptor* f : fields) {
    out << YAML::Key << f->name() << YAML::Value;
    if (f->is_map()) {
      out << YAML::BeginMap;
      const int n = r->FieldSize(m, f);
      // Sorted by key, so the text does not depend on the map's iteration order.
      std::vector<std::pair<std::string, std::string>> kv;
      for (int i = 0; i < n; ++i) {
        const Message& e = r->GetRepeatedMessage(m, f, i);
        const auto* ed = e.GetDescriptor();
        kv.push_back({e.GetReflection()->GetString(e, ed->FindFieldByName("key")),
                      e.GetReflection()->GetString(e, ed->FindFieldByName("value"))});
      }
      std::sort(kv.begin(), kv.end());
      for (const auto& [k, v] : kv) out << YAML::Key << YAML::DoubleQuoted << k << YAML::Value << YAML::DoubleQuoted << v;
      out << YAML::EndMap;
    } else if (f->is_repeated()) {
      out << YAML::BeginSeq;
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          EmitMessage(out, r->GetRepeatedMessage(m, f, i));
        } else {
          EmitScalar(out, m, f, i);
        }
      }
      out << YAML::EndSeq;
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      EmitMessage(out, r->GetMessage(m, f));
    } else {
      EmitScalar(out, m, f, -1);
    }
  }
  out << YAML::EndMap;
}

}  // namespace

std::string ToYaml(const Message& msg) {
  YAML::Emitter out;
  EmitMessage(out, msg);
  return std::string(out.c_str()) + "\n";
}

absl::Status FillFromYaml(const YAML::Node& node, Message* msg, const std::string& root_name) {
  return FillMessage(node, msg, root_name, "", 0);
}

absl::Status ParseYamlInto(const std::string& text, Message* msg, const std::string& root_name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(root_name, " is not valid YAML/JSON: ", e.what()));
  }
  return FillFromYaml(root, msg, root_name);
}

absl::Status SetFieldFromText(const std::string& text, const FieldDescriptor* f, Message* msg,
                              const std::string& path) {
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return Bad(path, path, "is a group of settings, not a value");
  }
  return SetScalar(YAML::Node(text), f, msg, path, path, f->is_repeated());
}

}  // namespace ember::spec
