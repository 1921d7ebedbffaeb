#include "runtime/base/flags.h"

#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "runtime/base/logging.h"

ABSL_FLAG(std::string, log_format, "human", "log line format: human or json (JSON lines)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical, off");
ABSL_FLAG(std::string, log_file, "", "also append log lines to this file");

namespace ember::base {

std::vector<std::string> ParseFlagsAndInitLogging(int argc, char** argv, const char* program) {
  absl::SetProgramUsageMessage(std::string(program) + " (see --help)");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
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
