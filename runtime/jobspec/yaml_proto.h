// YAML (or JSON) text -> any protobuf message, by field name: what ParseJobSpec and emberd's
// config file (runtime/daemon/config.h) share. Only scalar, repeated scalar and nested message
// fields are supported (no maps, no oneofs needed so far).
//
//   ember::daemon::v1::DaemonConfig cfg;
//   RETURN_IF_ERROR(spec::ParseYamlInto(text, &cfg));        // "work_rot: unknown field; ..."
//
// Errors are INVALID_ARGUMENT and start with the field path ("model.mlp: ...", "data_root[2]:
// ...", or `root_name` for the document itself): unknown fields (listing the allowed ones),
// duplicate keys (naming the line), wrong types ("'abc' is not a valid int32"), lists where a value
// is expected and the reverse, non-finite floats, strings that are not valid UTF-8, more than 1024 list entries, nesting deeper than
// 8. Thread-safe (pure functions).
#ifndef EMBER_RUNTIME_JOBSPEC_YAML_PROTO_H_
#define EMBER_RUNTIME_JOBSPEC_YAML_PROTO_H_

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "yaml-cpp/yaml.h"

namespace ember::spec {

// Parses `text` and sets the fields it names in *msg (fields it does not name are left alone;
// repeated fields are appended to). An empty document sets nothing. `root_name` names the
// document in errors that are not about one field ("config: expected a mapping ...").
absl::Status ParseYamlInto(const std::string& text, google::protobuf::Message* msg,
                           const std::string& root_name = "spec");

// The same for a document already loaded (a caller that looks at it first, as ParseJobSpec does).
absl::Status FillFromYaml(const YAML::Node& node, google::protobuf::Message* msg,
                          const std::string& root_name = "spec");

// Sets scalar field `f` of *msg from `text`, read as YAML reads a plain scalar ("true", "yes",
// "0.5", "12"); a repeated field gets the value appended. Errors name `path`. For command-line
// flags that set message fields.
absl::Status SetFieldFromText(const std::string& text, const google::protobuf::FieldDescriptor* f,
                              google::protobuf::Message* msg, const std::string& path);

// The reverse: *msg as YAML, every field that is set (proto3 fields with presence when present,
// others when not zero/empty), in field-number order; floats printed so they read back exactly.
// FillFromYaml(YAML::Load(ToYaml(m)), &m2) gives m2 == m.
std::string ToYaml(const google::protobuf::Message& msg);

}  // namespace ember::spec

#endif  // EMBER_RUNTIME_JOBSPEC_YAML_PROTO_H_
