#include "runtime/daemon/spec_policy.h"

#include <pwd.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/torch_env.h"

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
      {"worker.script", spec.worker().script(), true},
  };
  for (const Field& f : fields) {
    std::vector<std::string> none;
    absl::Status s = CheckPath(f.name, f.value, f.data ? data_roots : none);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

// getpwnam_r / getpwuid_r into a ScriptIdentity; NOT_FOUND when there is no such user.
absl::StatusOr<ScriptIdentity> LookUp(const std::string* name, uid_t uid) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  int rc = name != nullptr ? getpwnam_r(name->c_str(), &pw, buf.data(), buf.size(), &found)
                           : getpwuid_r(uid, &pw, buf.data(), buf.size(), &found);
  if (rc != 0 || found == nullptr) {
    return absl::NotFoundError(name != nullptr
                                   ? absl::StrCat("script_user: no user '", *name, "' on this node")
                                   : absl::StrCat("no user with uid ", uid));
  }
  ScriptIdentity id;
  id.uid = pw.pw_uid;
  id.gid = pw.pw_gid;
  id.name = pw.pw_name;
  return id;
}

}  // namespace

absl::StatusOr<ScriptIdentity> ScriptIdentityFor(uid_t daemon_euid, const std::string& script_user,
                                                 bool allow_root_scripts) {
  if (daemon_euid != 0) {
    if (script_user.empty()) return ScriptIdentity{false, daemon_euid, 0, ""};
    auto self = LookUp(nullptr, daemon_euid);
    auto want = LookUp(&script_user, 0);
    if (!want.ok()) return want.status();
    if (self.ok() && self->uid == want->uid) return ScriptIdentity{false, daemon_euid, 0, self->name};
    return absl::FailedPreconditionError(absl::StrCat(
        "script_user: '", script_user, "' differs from emberd's own user (uid ", daemon_euid,
        ") and only emberd running as root can switch users; unset script_user to run scripts as "
        "emberd's user"));
  }
  if (!allow_root_scripts) {
    return absl::FailedPreconditionError(
        "emberd runs as root and refuses script jobs (worker.script): run emberd as an "
        "unprivileged user (the shipped unit's User=ember), or set allow_root_scripts: true in "
        "its config (with script_user: NAME to run scripts as NAME)");
  }
  if (script_user.empty()) return ScriptIdentity{false, 0, 0, "root"};
  ASSIGN_OR_RETURN(ScriptIdentity id, LookUp(&script_user, 0));
  id.switch_user = id.uid != 0;
  return id;
}

absl::Status CheckScriptEnv(const spec::v1::JobSpec& spec) {
  for (const auto& [k, v] : spec.worker().env()) {
    if (job::IsTorchContractName(k)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker.env.", k, ": set by the daemon for every rank (torchrun's contract, "
          "docs/operations.md \"Running PyTorch scripts\"); remove it"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckUploadName(const std::string& name) {
  bool odd_part = false;  // "a//b", "a/./b", "a/": a part that names no file of its own
  for (absl::string_view part : absl::StrSplit(name, '/')) odd_part = odd_part || part.empty() || part == ".";
  if (name.empty() || name[0] == '/' || name[0] == '.' || ClimbsOut(name) || odd_part ||
      name.size() > 200) {
    return absl::PermissionDeniedError(absl::StrCat(
        "files: '", absl::CHexEscape(name.substr(0, 200)),
        "' must be a relative name inside the job directory (no \"..\", \".\" or empty parts)"));
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

absl::Status CheckJobId(absl::string_view id) {
  bool ok = !id.empty() && id.size() <= 128 && absl::ascii_isalnum(id[0]);
  for (char c : id) ok = ok && (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.');
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "job id '", absl::CHexEscape(id.substr(0, 128)),
      "' is not one emberd makes (1-128 characters of [A-Za-z0-9._-], the first a letter or digit)"));
}

absl::StatusOr<std::string> ScriptMasterAddr(const std::string& comm_host,
                                             const std::string& advertise, int nodes) {
  const std::string host = comm_host.empty() ? "127.0.0.1" : comm_host;
  if (nodes > 1 && (absl::StartsWith(host, "127.") || host == "localhost")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job spans ", nodes, " nodes but this daemon advertises '", advertise,
        "', so MASTER_ADDR would be ", host, ", unreachable from the other nodes; give emberd a "
        "routable address (--listen or advertise)"));
  }
  return host;
}

}  // namespace ember::daemon
