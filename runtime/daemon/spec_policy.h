// What a submitted job may name. A spec never names an executable (the daemon runs only its
// configured worker), and every path in it resolves inside the job directory, or inside one of the
// operator's read-only data roots (--data-root). Thread-safe (pure functions).
#ifndef EMBER_RUNTIME_DAEMON_SPEC_POLICY_H_
#define EMBER_RUNTIME_DAEMON_SPEC_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/job_spec.pb.h"

namespace ember::daemon {

// PERMISSION_DENIED naming the field when a path is absolute outside `data_roots`, or climbs out
// with "..". (Unknown keys such as "command" are already INVALID_ARGUMENT from the spec parser.)
absl::Status CheckSpecPaths(const spec::v1::JobSpec& spec,
                            const std::vector<std::string>& data_roots);

// Names of uploaded files: relative, no "..", no leading '.', [A-Za-z0-9._/-] only.
absl::Status CheckUploadName(const std::string& name);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_SPEC_POLICY_H_
