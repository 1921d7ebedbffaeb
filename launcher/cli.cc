#include "launcher/cli.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "google/protobuf/util/json_util.h"

namespace ember::cli {
namespace fs = std::filesystem;

const std::vector<Option>& GlobalOptions() {
  static const auto* v = new std::vector<Option>{
      {"--address", "HOST:PORT", "emberd to talk to ($EMBER_ADDRESS, default 127.0.0.1:29400)"},
      {"--token-file", "FILE", "cluster token ($EMBER_TOKEN_FILE, default /etc/ember/token if "
                               "readable)"},
      {"--tls-ca", "FILE", "talk TLS, trusting this CA ($EMBER_TLS_CA)"},
      {"--tls-cert", "FILE", "client certificate for mTLS ($EMBER_TLS_CERT)"},
      {"--tls-key", "FILE", "its key ($EMBER_TLS_KEY)"},
      {"--output", "text|json", "machine-readable output with json"},
      {"--help", "", "this text; `emberctl COMMAND --help` (or `emberctl help COMMAND`) for a "
                     "command"},
  };
  return *v;
}

namespace {

constexpr char kExitCodes[] =
    "exit codes: 0 ok/SUCCEEDED, 1 FAILED, 2 usage or rejected request, 3 daemon unreachable,\n"
    "            4 bad or missing token (or token file), 5 no such job, 6 CANCELLED, 7 other "
    "error,\n            8 run --slurm requeued on the time-limit warning\n";

std::string OptionLine(const Option& o, int width) {
  std::string name = *o.arg ? absl::StrCat(o.name, " ", o.arg) : o.name;
  if (static_cast<int>(name.size()) > width) {
    return absl::StrCat("  ", name, "\n  ", std::string(width, ' '), " ", o.help, "\n");
  }
  return absl::StrFormat("  %-*s %s\n", width, name, o.help);
}

bool TakesValue(const std::string& k) {
  for (const Option& o : GlobalOptions()) {
    if (k == o.name) return *o.arg != '\0';
  }
  for (const Command& c : Commands()) {
    for (const Option& o : c.options) {
      if (k == o.name && *o.arg) return true;
    }
  }
  return false;
}

}  // namespace

std::string TopHelp() {
  std::string out =
      "emberctl: submit and watch Ember training jobs.\n\n"
      "usage: emberctl [global options] COMMAND [options] [args]\n\ncommands:\n";
  for (const Command& c : Commands()) {
    if (std::string(c.usage).size() < 40) {
      absl::StrAppendFormat(&out, "  %-40s %s\n", c.usage, c.summary);
    } else {
      absl::StrAppendFormat(&out, "  %s\n  %-40s %s\n", c.usage, "", c.summary);
    }
  }
  out += "\nglobal options (also from the environment):\n";
  for (const Option& o : GlobalOptions()) out += OptionLine(o, 20);
  return absl::StrCat(out, "\n", kExitCodes);
}

std::string CommandHelp(const std::string& name) {
  std::string out;
  for (const Command& c : Commands()) {
    if (name != c.name) continue;
    absl::StrAppend(&out, out.empty() ? "" : "\n", "usage: emberctl ", c.usage, "\n", c.details);
    for (const Option& o : c.options) out += OptionLine(o, 20);
  }
  return out.empty() ? TopHelp() : out;
}

bool ParseArgs(int argc, char** argv, Args* a, std::string* err) {
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--") {
      a->passthrough.assign(argv + i + 1, argv + argc);
      break;
    }
    if (s.size() > 1 && s[0] == '-' && s != "-") {
      if (s == "-f") s = "--follow";
      if (s == "-h") s = "--help";
      std::string key = s, value;
      size_t eq = s.find('=');
      if (eq != std::string::npos) {
        key = s.substr(0, eq);
        value = s.substr(eq + 1);
      } else if (TakesValue(key)) {
        if (i + 1 >= argc) {
          *err = key + " needs a value";
          return false;
        }
        value = argv[++i];
      }
      a->opts[key] = value;
    } else {
      a->positional.push_back(s);
    }
  }
  return true;
}

std::atomic<bool>& Interrupted() {
  static std::atomic<bool> interrupted{false};
  return interrupted;
}

void OnInterrupt(int) { Interrupted() = true; }

Ctl::Ctl(Args a, std::string argv0)
    : a_(std::move(a)), json_(a_.Get("--output") == "json"), argv0_(std::move(argv0)) {}

int Ctl::Fail(const absl::Status& s) {
  int code = kOther;
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition: code = kUsage; break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded: code = kUnreachable; break;
    case absl::StatusCode::kUnauthenticated: code = kAuth; break;
    case absl::StatusCode::kNotFound: code = kNotFound; break;
    default: break;
  }
  if (json_) {
    std::cout << "{\"error\":{\"code\":\"" << absl::StatusCodeToString(s.code())
              << "\",\"message\":" << Quote(std::string(s.message())) << "},\"exit_code\":"
              << code << "}\n";
  } else {
    std::cerr << "emberctl: " << absl::StatusCodeToString(s.code()) << ": " << s.message()
              << "\n";
  }
  return code;
}

int Ctl::UsageError(const std::string& message) {
  std::cerr << "emberctl: " << message << "\n";
  return kUsage;
}

bool Ctl::IntOption(const char* flag, int min, int* out) {
  if (!a_.Has(flag)) return true;
  if (absl::SimpleAtoi(a_.Get(flag), out) && *out >= min) return true;
  if (min == 0) {
    UsageError(absl::StrCat(flag, " needs a number >= 0, not '", a_.Get(flag), "'"));
  } else {
    UsageError(absl::StrCat(flag, " needs a positive number"));
  }
  return false;
}

std::string Ctl::Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) out += absl::StrFormat("\\u%04x", c);
    else out += c;
  }
  return out + "\"";
}

std::string Ctl::ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string Ctl::UserPath(const std::string& p) {
  if (!p.empty() && p[0] == '/') return p;
  const char* wd = getenv("BUILD_WORKING_DIRECTORY");
  return wd ? (fs::path(wd) / p).string() : fs::absolute(p).string();
}

absl::StatusOr<Client> Ctl::Connect() {
  ClientOptions o;
  const char* env_addr = getenv("EMBER_ADDRESS");
  o.address = a_.Get("--address", env_addr ? env_addr : "127.0.0.1:29400");
  const char* env_tok = getenv("EMBER_TOKEN_FILE");
  std::string token_file = a_.Get("--token-file", env_tok ? env_tok : "");
  if (token_file.empty() && access("/etc/ember/token", R_OK) == 0) token_file = "/etc/ember/token";
  if (!token_file.empty()) {
    // A missing, unreadable or empty token file is a token problem (exit 4), like a wrong
    // token, not "no such job" (NOT_FOUND, exit 5) or a bad request.
    auto t = base::ReadTokenFile(token_file);
    if (!t.ok()) {
      return absl::UnauthenticatedError(absl::StrCat(
          t.status().message(), "; pass --token-file FILE or set $EMBER_TOKEN_FILE"));
    }
    o.token = *t;
  }
  auto env_or = [](const char* name) { const char* v = getenv(name); return v ? v : ""; };
  o.tls.ca_file = a_.Get("--tls-ca", env_or("EMBER_TLS_CA"));
  o.tls.cert_file = a_.Get("--tls-cert", env_or("EMBER_TLS_CERT"));
  o.tls.key_file = a_.Get("--tls-key", env_or("EMBER_TLS_KEY"));
  return Client::Connect(o);
}

int Ctl::Run() {
  const std::vector<std::string>& p = a_.positional;
  if (p.empty()) {
    std::cout << TopHelp();
    return a_.Has("--help") ? kOk : kUsage;
  }
  const std::string& cmd = p[0];
  if (cmd == "help") {
    std::cout << (p.size() > 1 ? CommandHelp(p[1]) : TopHelp());
    return kOk;
  }
  if (a_.Has("--help")) {
    std::cout << CommandHelp(cmd);
    return kOk;
  }
  // The row: the command's only one, or the one its subcommand names (none: usage below).
  std::vector<const Command*> rows;
  for (const Command& c : Commands()) {
    if (cmd == c.name) rows.push_back(&c);
  }
  const Command* row = nullptr;
  for (const Command* c : rows) {
    if (!*c->sub || (p.size() > 1 && p[1] == c->sub)) row = c;
  }
  // Every option given is global or the command's; anything else is a usage error (exit 2),
  // never silently ignored. Without a row, any option of the command's rows is allowed here.
  std::set<std::string> allowed;
  for (const Option& o : GlobalOptions()) allowed.insert(o.name);
  for (const Command* c : rows) {
    if (row == nullptr || c == row) {
      for (const Option& o : c->options) allowed.insert(o.name);
    }
  }
  for (const auto& [k, v] : a_.opts) {
    if (allowed.count(k) == 0) {
      std::cerr << "emberctl: unknown option '" << k << "' for '" << cmd << "'\n"
                << CommandHelp(cmd);
      return kUsage;
    }
  }
  if (rows.empty()) {
    std::cerr << "emberctl: unknown command '" << cmd << "'\n\n" << TopHelp();
    return kUsage;
  }
  const size_t skip = row != nullptr && *row->sub ? 2 : 1;
  if (row == nullptr || p.size() < skip + row->min_args) {
    std::cerr << CommandHelp(cmd);
    return kUsage;
  }
  rest_.assign(p.begin() + skip, p.end());
  if (!a_.passthrough.empty() && !row->passthrough) {
    std::cerr << "emberctl: '" << cmd << "' takes no arguments after --\n" << CommandHelp(cmd);
    return kUsage;
  }
  return row->run(*this);
}

}  // namespace ember::cli
