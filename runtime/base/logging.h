// Logging setup for every Ember binary: spdlog, human-readable lines by default, one JSON object
// per line with --log-format=json ({"ts","level","logger","pid","msg"}).
//
// Call InitLogging() once at the start of main(), before other threads log. After that, log with
// spdlog::info(...) etc. from any thread (spdlog's default logger is thread-safe).
#ifndef EMBER_RUNTIME_BASE_LOGGING_H_
#define EMBER_RUNTIME_BASE_LOGGING_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace ember::base {

enum class LogFormat { kHuman, kJson };

struct LogOptions {
  LogFormat format = LogFormat::kHuman;
  std::string level = "info";  // trace, debug, info, warn, error, critical, off
  std::string name = "ember";  // logger name shown in each line
  std::string file;            // if set, also append to this file
};

// Parses "human" / "json"; anything else is InvalidArgument naming the value.
absl::Status ParseLogFormat(absl::string_view text, LogFormat* out);

// Installs the default spdlog logger. InvalidArgument on an unknown level.
absl::Status InitLogging(const LogOptions& options);

// Human-format log lines escape control characters in the message (EscapeControl): a newline
// in text from outside (a job name, a path) can never forge a log line.
//
// Returns `s` with \n, \r, \t as two-character escapes and other control bytes (< 0x20, 0x7f)
// as \xNN; everything else unchanged.
std::string EscapeControl(absl::string_view s);

// Escapes `s` for inclusion inside a JSON string literal (quotes not added).
std::string JsonEscape(absl::string_view s);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_LOGGING_H_
