#include "runtime/base/logging.h"

#include <unistd.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "spdlog/details/log_msg.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/basic_file_sink.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace ember::base {
namespace {

class JsonFormatter : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    absl::Time t = absl::FromChrono(msg.time);
    std::string line = absl::StrCat(
        "{\"ts\":\"", absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone()),
        "\",\"level\":\"", std::string(spdlog::level::to_string_view(msg.level).data(), spdlog::level::to_string_view(msg.level).size()), "\",\"logger\":\"",
        JsonEscape(absl::string_view(msg.logger_name.data(), msg.logger_name.size())),
        "\",\"pid\":", getpid(), ",\"msg\":\"",
        JsonEscape(absl::string_view(msg.payload.data(), msg.payload.size())), "\"}\n");
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

// %* in the human pattern: the message with control characters escaped, so text that came from
// outside (a job name, a path, a peer's error) can never end the line and forge another one.
class EscapedPayload : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    absl::string_view p(msg.payload.data(), msg.payload.size());
    bool clean = true;
    for (unsigned char c : p) clean = clean && c >= 0x20 && c != 0x7f;
    if (clean) {
      dest.append(p.data(), p.data() + p.size());
      return;
    }
    std::string e = EscapeControl(p);
    dest.append(e.data(), e.data() + e.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<EscapedPayload>();
  }
};

}  // namespace

std::string EscapeControl(absl::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (unsigned char c : s) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\x%02x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::string JsonEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

absl::Status ParseLogFormat(absl::string_view text, LogFormat* out) {
  if (text == "human" || text == "text") {
    *out = LogFormat::kHuman;
  } else if (text == "json") {
    *out = LogFormat::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --log-format '", text, "'; use 'human' or 'json'"));
  }
  return absl::OkStatus();
}

absl::Status InitLogging(const LogOptions& options) {
  auto level = spdlog::level::from_str(options.level);
  if (level == spdlog::level::off && options.level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown log level '", options.level,
        "'; use trace, debug, info, warn, error, critical or off"));
  }
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (!options.file.empty()) {
    sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.file));
  }
  auto logger = std::make_shared<spdlog::logger>(options.name, sinks.begin(), sinks.end());
  if (options.format == LogFormat::kJson) {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<EscapedPayload>('*').set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ %n[%P] %*");
    logger->set_formatter(std::move(formatter));
  }
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace ember::base
