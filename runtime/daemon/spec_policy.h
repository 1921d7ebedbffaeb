// What a submitted job may name. Every path in a spec resolves inside the job directory, or inside
// one of the operator's read-only data roots (--data-root). A built-in job runs the configured
// worker; a script job (worker.script) runs the user's program with worker.python, as the user
// ScriptIdentityFor decides: whoever holds the token runs code as that user. Thread-safe.
#ifndef EMBER_RUNTIME_DAEMON_SPEC_POLICY_H_
#define EMBER_RUNTIME_DAEMON_SPEC_POLICY_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/job_spec.pb.h"

namespace ember::daemon {

// PERMISSION_DENIED naming the field when a path is absolute outside `data_roots`, or climbs out
// with "..". (Unknown keys such as "command" are already INVALID_ARGUMENT from the spec parser.)
absl::Status CheckSpecPaths(const spec::v1::JobSpec& spec,
                            const std::vector<std::string>& data_roots);

// Who runs a script job's ranks. switch_user: the child sets its groups, gid and uid to these
// (a root daemon with script_user); otherwise it keeps the daemon's.
struct ScriptIdentity {
  bool switch_user = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string name;
};

// The policy (daemon_euid is geteuid() in the daemon; a parameter for tests):
//   * not root, script_user "" or the daemon's own user: run as the daemon's user;
//   * not root, another script_user: FAILED_PRECONDITION (only root can switch users);
//   * root without allow_root_scripts: FAILED_PRECONDITION naming allow_root_scripts;
//   * root with allow_root_scripts: as script_user when set (its uid and primary group; NOT_FOUND
//     for an unknown user), else as root.
absl::StatusOr<ScriptIdentity> ScriptIdentityFor(uid_t daemon_euid, const std::string& script_user,
                                                 bool allow_root_scripts);

// worker.env of a script job may not set the contract's names (runtime/job/torch_env.h
// IsTorchContractName): INVALID_ARGUMENT naming the variable. OK for a built-in job.
absl::Status CheckScriptEnv(const spec::v1::JobSpec& spec);

// The MASTER_ADDR that a script job's rank-0 daemon gives every rank: `comm_host` (CommHostOf its
// advertised address), 127.0.0.1 when that is "". FAILED_PRECONDITION naming `advertise` when the
// job spans several nodes and the address is loopback: the other nodes' ranks could not reach it
// (torch would retry until its timeout, 30 min by default).
absl::StatusOr<std::string> ScriptMasterAddr(const std::string& comm_host,
                                             const std::string& advertise, int nodes);

// Names of uploaded files: relative, no "..", "." or empty parts, no leading '.',
// [A-Za-z0-9._/-] only. Submit checks them, and so does every node that writes them from the store
// (the store is not trusted: anyone who can write a key could name "../../x").
absl::Status CheckUploadName(const std::string& name);

// A job id as emberd makes them (JobIdFor): 1-128 characters of [A-Za-z0-9._-], the first a letter
// or digit (so never "." or ".."), INVALID_ARGUMENT otherwise. Checked for every id read from the
// store (a key under active/ or joblist/, the id in a record) before the id names a directory or
// a key, and for ids given to the API and the job page.
absl::Status CheckJobId(absl::string_view id);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_SPEC_POLICY_H_
