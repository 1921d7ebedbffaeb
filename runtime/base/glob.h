// Glob patterns over names ("blocks.*.ln?.weight"): '*' matches any run of characters (also
// across '.'), '?' exactly one; every other character matches itself (no classes, no escapes).
// The one matcher of precision overrides: FSDP applies them (runtime/fsdp/policy.h) and
// spec::Resolve refuses a pattern that matches no parameter (runtime/model/from_spec.h), so the
// two can never disagree. Pure; thread-safe.
#ifndef EMBER_RUNTIME_BASE_GLOB_H_
#define EMBER_RUNTIME_BASE_GLOB_H_

#include <string>

namespace ember::base {

bool GlobMatch(const std::string& pattern, const std::string& name);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_GLOB_H_
