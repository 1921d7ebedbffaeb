#include "runtime/daemon/spec_policy.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ember::daemon {
namespace {

bool ClimbsOut(const std::string& path) {
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return true;
  }
  return false;
}

absl::Status CheckPath(const char* field, const std::string& path,
                       const std::vector<std::string>& roots) {
  if (path.empty()) return absl::OkStatus();
  if (ClimbsOut(path)) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": '", path, "' leaves the job directory (\"..\" is not allowed)"));
  }
  if (path[0] != '/') return absl::OkStatus();
  for (const std::string& root : roots) {
    std::string r = absl::EndsWith(root, "/") ? root : root + "/";
    if (absl::StartsWith(path, r)) return absl::OkStatus();
  }
  if (roots.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ": '", path,
        "' is outside the job directory and no data root allows it (none configured); use a "
        "relative path (uploaded with the spec), or ask the operator for emberd --data-root"));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": '", path, "' is outside the job directory and the data roots (",
      absl::StrJoin(roots, ", "), "); use a path under one of them, or a relative path"));
}

}  // namespace

absl::Status CheckSpecPaths(const spec::v1::JobSpec& spec,
                            const std::vector<std::string>& data_roots) {
  struct Field {
    const char* name;
    const std::string& value;
    bool data;  // may be under a data root
  };
  const Field fields[] = {
      {"data.path", spec.data().path(), true},
      {"data.text_path", spec.data().text_path(), true},
      {"checkpoint.dir", spec.checkpoint().dir(), false},
      {"checkpoint.init_from_safetensors", spec.checkpoint().init_from_safetensors(), true},
      {"checkpoint.init_from", spec.checkpoint().init_from(), true},
  };
  for (const Field& f : fields) {
    std::vector<std::string> none;
    absl::Status s = CheckPath(f.name, f.value, f.data ? data_roots : none);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckUploadName(const std::string& name) {
  if (name.empty() || name[0] == '/' || name[0] == '.' || ClimbsOut(name) || name.size() > 200) {
    return absl::PermissionDeniedError(
        absl::StrCat("files: '", name, "' must be a relative name inside the job directory"));
  }
  for (char c : name) {
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
          c == '/')) {
      return absl::InvalidArgumentError(
          absl::StrCat("files: '", name, "' has a character outside [A-Za-z0-9._/-]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ember::daemon
