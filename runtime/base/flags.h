// Flags shared by every Ember binary (--log-format, --log-level, --log-file) and the one-call
// setup: ParseFlagsAndInitLogging(argc, argv, "ember-store").
// Call once from main() before starting threads.
#ifndef EMBER_RUNTIME_BASE_FLAGS_H_
#define EMBER_RUNTIME_BASE_FLAGS_H_

#include <string>
#include <vector>

namespace ember::base {

// Parses absl flags, sets up logging from --log-format/--log-level/--log-file and returns the
// positional arguments (argv[0] first). Exits with status 2 and a message on a bad flag value.
std::vector<std::string> ParseFlagsAndInitLogging(int argc, char** argv, const char* program);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_FLAGS_H_
