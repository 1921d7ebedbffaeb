#include "runtime/base/flags.h"

#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "runtime/base/logging.h"

ABSL_FLAG(std::string, log_format, "human", "log line format: human or json (JSON lines)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical, off");
ABSL_FLAG(std::string, log_file, "", "also append log lines to this file");
ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "abseil's runtime lock-order checking (costs ~10% of the store's CPU per request; tests "
          "keep it on)");

namespace ember::base {

std::vector<std::string> ParseFlagsAndInitLogging(int argc, char** argv, const char* program) {
  absl::SetProgramUsageMessage(std::string(program) + " (see --help)");
  // Accept --log-format as well as --log_format: flag names are spelled with dashes in the docs.
  static std::vector<std::string> storage;
  static std::vector<char*> args;
  storage.assign(argv, argv + argc);
  for (size_t i = 1; i < storage.size(); ++i) {
    std::string& a = storage[i];
    if (a == "--") break;
    if (a.size() > 2 && a[0] == '-' && a[1] == '-') {
      size_t end = a.find('=');
      if (end == std::string::npos) end = a.size();
      for (size_t j = 2; j < end; ++j) {
        if (a[j] == '-') a[j] = '_';
      }
    }
  }
  args.clear();
  for (auto& a : storage) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<char*> rest = absl::ParseCommandLine(argc, args.data());
  if (!absl::GetFlag(FLAGS_mutex_deadlock_detection)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  LogOptions opts;
  opts.name = program;
  opts.level = absl::GetFlag(FLAGS_log_level);
  opts.file = absl::GetFlag(FLAGS_log_file);
  absl::Status s = ParseLogFormat(absl::GetFlag(FLAGS_log_format), &opts.format);
  if (s.ok()) s = InitLogging(opts);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, std::string(s.message()).c_str());
    std::exit(2);
  }
  return std::vector<std::string>(rest.begin(), rest.end());
}

}  // namespace ember::base
