// emberctl: the Ember command line. `emberctl --help` lists the commands; every command has --help.
//
// Exit codes (stable, for scripts):
//   0  success (with --follow / run: the job SUCCEEDED)
//   1  the job FAILED
//   2  usage error (an unknown option or a bad option value, for every command; a missing
//      argument), or the daemon rejected the request (bad spec: INVALID_ARGUMENT names the
//      field; PERMISSION_DENIED for a path outside the job directory)
//   3  the daemon is unreachable
//   4  authentication failed (missing or wrong token, or a token file that is missing, unreadable
//      or holds no token)
//   5  no such job
//   6  the job was CANCELLED
//   7  any other error
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "checkpoint/tools.h"
#include "google/protobuf/util/json_util.h"
#include "launcher/client.h"
#include "runtime/flight/analyze.h"
#include "launcher/standalone.h"
#include "spdlog/spdlog.h"
#include "yaml-cpp/yaml.h"

namespace {

namespace v1 = ember::jobs::v1;
namespace fs = std::filesystem;

enum Exit { kOk = 0, kJobFailed = 1, kUsage = 2, kUnreachable = 3, kAuth = 4, kNotFound = 5,
            kCancelled = 6, kOther = 7 };

constexpr char kTopHelp[] = R"(emberctl: submit and watch Ember training jobs.

usage: emberctl [global options] COMMAND [options] [args]

commands:
  run --standalone [--nproc N] JOB.yaml   run a job on this machine (embedded store + daemon)
  submit JOB.yaml [--follow] [--id SID]   submit to a cluster; --follow waits and exits with the result
  status [JOB]                            one job in detail, or the active jobs
  list [--all]                            jobs, newest first
  logs JOB [-f] [--rank R] [--tail N]     worker logs (every rank, or one)
  cancel JOB                              stop every worker of the job
  nodes                                   daemons, devices (and which job holds each), telemetry
  dump JOB                                ask every rank of a running job to dump its flight recorder
  fr analyze DIR [--json]                 explain a hang from flight-recorder dumps
  ckpt inspect PATH [--verify]            summarise a checkpoint or safetensors file (exit 1: damaged)
  ckpt export CKPT OUT [--max-shard-bytes N]  unsharded weights as safetensors (N: a sharded set)

global options (also from the environment):
  --address HOST:PORT   emberd to talk to ($EMBER_ADDRESS, default 127.0.0.1:29400)
  --token-file FILE     cluster token ($EMBER_TOKEN_FILE, default /etc/ember/token if readable)
  --tls-ca FILE         talk TLS, trusting this CA ($EMBER_TLS_CA)
  --tls-cert/--tls-key  client certificate and key for mTLS ($EMBER_TLS_CERT, $EMBER_TLS_KEY)
  --output text|json    machine-readable output with json
  --help                this text; `emberctl COMMAND --help` for a command

exit codes: 0 ok/SUCCEEDED, 1 FAILED, 2 usage or rejected request, 3 daemon unreachable,
            4 bad or missing token (or token file), 5 no such job, 6 CANCELLED, 7 other error
)";

const std::map<std::string, std::string>& CommandHelp() {
  static const auto* m = new std::map<std::string, std::string>{
      {"run", "usage: emberctl run --standalone [--nproc N] [--max-ranks N] [--work-root DIR] "
              "[--worker PATH] JOB.yaml\n  Starts a store and a daemon inside emberctl with a "
              "one-time token, runs the job on\n  this machine with a live progress line, and "
              "exits with the job's result.\n  SIGINT, SIGTERM or SIGHUP cancel the job; the "
              "workers die with emberctl even on kill -9.\n"
              "  --nproc N       ranks (overrides parallelism.world_size)\n"
              "  --max-ranks N   allow up to N CPU ranks (default 4 x the online cores)\n"
              "  --work-root DIR job directories (default ./ember-jobs)\n"
              "  --worker PATH   the worker binary ($EMBER_WORKER; default: next to emberctl)\n"},
      {"submit", "usage: emberctl submit JOB.yaml [--follow] [--id SUBMISSION_ID]\n"
                 "  Validates and queues the job. Data files named relatively in the spec are "
                 "uploaded\n  into the job directory (8 MiB total). --id makes retries idempotent.\n"
                 "  --follow streams progress and exits with the job's result.\n"},
      {"status", "usage: emberctl status [JOB]\n  One job with attempts, root cause and progress; "
                 "without JOB the active jobs.\n"},
      {"list", "usage: emberctl list [--all] [--limit N]\n  Jobs, newest first (--all includes "
               "finished ones; that is the default listing too).\n"},
      {"logs", "usage: emberctl logs JOB [-f|--follow] [--rank R] [--tail N]\n  Worker output; "
               "each line is prefixed with its rank when several are shown.\n"},
      {"cancel", "usage: emberctl cancel JOB\n  Stops every worker (SIGTERM, SIGKILL after the "
                 "grace period) and frees its devices.\n"},
      {"nodes", "usage: emberctl nodes\n  Registered daemons, their devices, which job holds "
                "each, memory and GPU telemetry.\n"},
      {"dump", "usage: emberctl dump JOB\n  Every rank writes its flight recorder to the printed "
               "directory; then run\n  `emberctl fr analyze DIR`.\n"},
      {"fr", "usage: emberctl fr analyze DIR [--json]\n  Reads rank-*.json dumps and names the "
             "rank/op/sequence number behind a hang.\n  Exit 0 when nothing is wrong, 1 when a "
             "problem was found.\n"},
      {"ckpt", "usage: emberctl ckpt inspect PATH [--verify] | ckpt export CKPT OUT "
               "[--include-optimizer] [--max-shard-bytes N]\n"
               "  inspect --verify exits 1 when any chunk is missing or corrupt.\n"
               "  export --max-shard-bytes N writes OUT/model-0000k-of-0000n.safetensors and\n"
               "  OUT/model.safetensors.index.json (Hugging Face layout).\n"},
  };
  return *m;
}

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> opts;  // "--x" -> value ("" for switches)
  bool Has(const std::string& k) const { return opts.count(k) > 0; }
  std::string Get(const std::string& k, const std::string& def = "") const {
    auto it = opts.find(k);
    return it == opts.end() ? def : it->second;
  }
};

// Options that take a value; everything else starting with '-' is a switch.
bool TakesValue(const std::string& k) {
  static const char* kValued[] = {"--address", "--token-file", "--tls-ca", "--tls-cert",
                                  "--tls-key", "--output", "--nproc", "--work-root", "--worker",
                                  "--max-ranks", "--rank", "--tail", "--id", "--limit",
                                  "--max-shard-bytes"};
  for (const char* v : kValued)
    if (k == v) return true;
  return false;
}

// The options each command accepts besides the global ones; anything else is a usage error
// (exit 2), never silently ignored.
const std::vector<std::string>& CommandOptions(const std::string& cmd) {
  static const auto* m = new std::map<std::string, std::vector<std::string>>{
      {"run", {"--standalone", "--nproc", "--max-ranks", "--work-root", "--worker"}},
      {"submit", {"--follow", "--id"}},
      {"status", {}},
      {"list", {"--all", "--limit"}},
      {"logs", {"--follow", "--rank", "--tail"}},
      {"cancel", {}},
      {"nodes", {}},
      {"dump", {}},
      {"fr", {"--json"}},
      {"ckpt", {"--verify", "--include-optimizer", "--max-shard-bytes"}},
  };
  static const std::vector<std::string> kNone;
  auto it = m->find(cmd);
  return it == m->end() ? kNone : it->second;
}

// "" when every option given is global or belongs to `cmd`; else the first one that does not.
std::string UnknownOption(const std::string& cmd, const std::map<std::string, std::string>& opts) {
  static const char* kGlobal[] = {"--address", "--token-file", "--tls-ca", "--tls-cert",
                                  "--tls-key", "--output", "--help"};
  const std::vector<std::string>& own = CommandOptions(cmd);
  for (const auto& [k, v] : opts) {
    bool ok = std::find(own.begin(), own.end(), k) != own.end();
    for (const char* g : kGlobal) ok = ok || k == g;
    if (!ok) return k;
  }
  return "";
}

bool Parse(int argc, char** argv, Args* a, std::string* err) {
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
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

class Ctl {
 public:
  explicit Ctl(Args a) : a_(std::move(a)), json_(a_.Get("--output") == "json") {}

  int Fail(const absl::Status& s) {
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

  static std::string Quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\', out += c;
      else if (c == '\n') out += "\\n";
      else if (static_cast<unsigned char>(c) < 0x20) out += absl::StrFormat("\\u%04x", c);
      else out += c;
    }
    return out + "\"";
  }

  static std::string ToJson(const google::protobuf::Message& m) {
    std::string out;
    google::protobuf::util::JsonPrintOptions o;
    o.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(m, &out, o);
    return out;
  }

  absl::StatusOr<ember::Client> Connect() {
    ember::ClientOptions o;
    const char* env_addr = getenv("EMBER_ADDRESS");
    o.address = a_.Get("--address", env_addr ? env_addr : "127.0.0.1:29400");
    const char* env_tok = getenv("EMBER_TOKEN_FILE");
    std::string token_file = a_.Get("--token-file", env_tok ? env_tok : "");
    if (token_file.empty() && access("/etc/ember/token", R_OK) == 0) token_file = "/etc/ember/token";
    if (!token_file.empty()) {
      // A missing, unreadable or empty token file is a token problem (exit 4), like a wrong
      // token, not "no such job" (NOT_FOUND, exit 5) or a bad request.
      auto t = ember::base::ReadTokenFile(token_file);
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
    return ember::Client::Connect(o);
  }

  // Relative paths are the user's: under `bazel run` that is $BUILD_WORKING_DIRECTORY, not the
  // runfiles directory bazel starts us in.
  static std::string UserPath(const std::string& p) {
    if (!p.empty() && p[0] == '/') return p;
    const char* wd = getenv("BUILD_WORKING_DIRECTORY");
    return wd ? (fs::path(wd) / p).string() : fs::absolute(p).string();
  }

  static std::string StateName(v1::JobState s) { return v1::JobState_Name(s); }

  static std::string ProgressLine(const v1::Progress& p) {
    if (p.step() == 0) return "";
    std::string eta = p.eta_s() > 0 ? absl::StrFormat(" eta %.0fs", p.eta_s()) : "";
    return absl::StrFormat("step %d/%d loss %.4f %.0f tok/s%s", p.step(), p.steps(), p.loss(),
                           p.tokens_per_s(), eta);
  }

  void PrintJob(const v1::Job& j, bool detail) {
    if (json_) {
      std::cout << ToJson(j) << "\n";
      return;
    }
    std::cout << absl::StrFormat("%-32s %-10s %d x %s  %s", j.id(), StateName(j.state()),
                                 j.world_size(), j.device_type(), ProgressLine(j.progress()));
    if (!j.reason().empty()) std::cout << "  (" << j.reason() << ")";
    std::cout << "\n";
    if (!detail) return;
    std::cout << "  name: " << j.name() << "\n  job dir: " << j.job_dir() << "\n";
    for (const auto& at : j.attempts()) {
      std::vector<std::string> where;
      for (const auto& na : at.assignment().nodes())
        where.push_back(absl::StrCat(na.node(), "[", absl::StrJoin(na.devices(), ","), "]"));
      std::cout << "  attempt " << at.number() << ": " << absl::StrJoin(where, " ");
      if (at.end_unix_ms() > 0 && at.start_unix_ms() > 0) {
        std::cout << absl::StrFormat("  ran %.1fs", (at.end_unix_ms() - at.start_unix_ms()) / 1e3);
      }
      if (at.last_step() > 0) std::cout << "  last step " << at.last_step();
      std::cout << "\n";
      if (!at.reason().empty()) std::cout << "    reason: " << at.reason() << "\n";
      if (!at.verdict().empty()) std::cout << "    flight recorder: " << at.verdict() << "\n";
    }
    if (j.has_root_cause() && !j.root_cause().last_log_lines().empty()) {
      std::cout << "  last lines of rank " << j.root_cause().rank() << ":\n";
      for (const auto& l : j.root_cause().last_log_lines()) std::cout << "    | " << l << "\n";
    }
  }

  static int ExitFor(v1::JobState s) {
    return s == v1::SUCCEEDED ? kOk : s == v1::CANCELLED ? kCancelled : kJobFailed;
  }

  // Follows a job with a live progress line until it ends; returns the exit code for its state.
  int Follow(ember::Client& c, const std::string& id) {
    bool tty = isatty(2);
    v1::JobState last_state = v1::JOB_STATE_UNSPECIFIED;
    int64_t last_step = -1;
    absl::Status s = c.StreamMetrics(id, true, 250, [&](const v1::MetricsUpdate& u) {
      if (json_) {
        std::cout << ToJson(u) << "\n" << std::flush;
      } else {
        std::string line = absl::StrCat("[", StateName(u.state()), "] ");
        auto it = u.ranks().find(0);
        if (it != u.ranks().end()) line += ProgressLine(it->second);
        if (tty) {
          std::cerr << "\r\033[K" << line << std::flush;
        } else if (u.state() != last_state ||
                   (it != u.ranks().end() && it->second.step() / 10 != last_step / 10)) {
          std::cerr << line << "\n";  // not a terminal: a line per state change / 10 steps
        }
        if (it != u.ranks().end()) last_step = it->second.step();
      }
      last_state = u.state();
      return !interrupted_;
    });
    if (tty && !json_) std::cerr << "\n";
    if (interrupted_) {
      std::cerr << "emberctl: interrupted; cancelling " << id << "\n";
      (void)c.Cancel(id);
    }
    if (!s.ok()) return Fail(s);
    auto job = c.Wait(id, absl::Seconds(30));
    if (!job.ok()) return Fail(job.status());
    if (!json_) PrintJob(*job, job->state() != v1::SUCCEEDED);
    return ExitFor(job->state());
  }

  // Reads a spec and the small relative files it names (uploaded into the job directory).
  absl::Status ReadSpec(const std::string& path, int nproc, std::string* yaml,
                        std::map<std::string, std::string>* files) {
    std::ifstream f(path);
    if (!f) return absl::NotFoundError("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    *yaml = ss.str();
    YAML::Node root;
    try {
      root = YAML::Load(*yaml);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
    }
    if (nproc > 0 && root.IsMap()) {
      root["parallelism"]["world_size"] = nproc;
      YAML::Emitter out;
      out << root;
      *yaml = out.c_str();
    }
    fs::path base = fs::absolute(path).parent_path();
    auto upload = [&](const char* section, const char* key) {
      if (!root.IsMap() || !root[section] || !root[section].IsMap() || !root[section][key]) return;
      std::string rel = root[section][key].as<std::string>("");
      if (rel.empty() || rel[0] == '/' || absl::StrContains(rel, "..")) return;
      fs::path p = base / rel;
      std::error_code ec;
      if (!fs::is_regular_file(p, ec) || fs::file_size(p, ec) > (8u << 20)) return;
      std::ifstream in(p, std::ios::binary);
      std::stringstream b;
      b << in.rdbuf();
      (*files)[rel] = b.str();
    };
    upload("data", "path");
    upload("data", "text_path");
    upload("checkpoint", "init_from_safetensors");
    return absl::OkStatus();
  }

  int Run() {
    if (a_.positional.empty()) {
      std::cout << kTopHelp;
      return a_.Has("--help") ? kOk : kUsage;
    }
    const std::string cmd = a_.positional[0];
    if (a_.Has("--help")) {
      auto it = CommandHelp().find(cmd);
      std::cout << (it == CommandHelp().end() ? kTopHelp : it->second);
      return kOk;
    }
    const auto& p = a_.positional;
    if (const std::string bad = UnknownOption(cmd, a_.opts); !bad.empty()) {
      auto it = CommandHelp().find(cmd);
      std::cerr << "emberctl: unknown option '" << bad << "' for '" << cmd << "'\n"
                << (it == CommandHelp().end() ? kTopHelp : it->second);
      return kUsage;
    }
    auto need = [&](size_t n) {
      if (p.size() >= n) return true;
      auto it = CommandHelp().find(cmd);
      std::cerr << (it == CommandHelp().end() ? kTopHelp : it->second);
      return false;
    };
    if (cmd == "fr") {
      if (!need(3) || p[1] != "analyze") return kUsage;
      auto r = ember::fr::AnalyzeDir(p[2]);
      if (!r.ok()) return Fail(r.status());
      std::cout << (json_ || a_.Has("--json") ? r->ToJson() : r->ToText()) << "\n";
      return r->problem ? 1 : 0;
    }
    if (cmd == "ckpt") {
      if (!need(3)) return kUsage;
      if (p[1] == "inspect") {
        ember::ckpt::InspectOptions o;
        o.json = json_;
        o.verify = a_.Has("--verify");
        auto r = ember::ckpt::InspectCheckpoint(p[2], o);
        if (!r.ok()) return Fail(r.status());
        std::cout << r->text << "\n";
        if (!r->checks.ok()) {  // a damaged checkpoint is never exit 0
          std::cerr << "emberctl: " << r->checks.message() << "\n";
          return kJobFailed;
        }
        return kOk;
      }
      if (p[1] == "export" && need(4)) {
        ember::ckpt::ExportOptions o;
        o.include_optimizer = a_.Has("--include-optimizer");
        if (a_.Has("--max-shard-bytes") &&
            (!absl::SimpleAtoi(a_.Get("--max-shard-bytes"), &o.max_shard_bytes) ||
             o.max_shard_bytes <= 0)) {
          std::cerr << "emberctl: --max-shard-bytes wants a positive byte count, got '"
                    << a_.Get("--max-shard-bytes") << "'\n";
          return kUsage;
        }
        auto r = ember::ckpt::ExportSafetensors(p[2], p[3], o);
        if (!r.ok()) return Fail(r.status());
        std::cout << "wrote " << *r << " bytes to " << p[3] << "\n";
        return kOk;
      }
      std::cerr << CommandHelp().at("ckpt");
      return kUsage;
    }
    if (cmd == "run") return RunStandalone();

    static const char* kKnown[] = {"submit", "status", "list", "logs", "cancel", "nodes", "dump"};
    bool known = false;
    for (const char* k : kKnown) known = known || cmd == k;
    if (!known) {
      std::cerr << "emberctl: unknown command '" << cmd << "'\n\n" << kTopHelp;
      return kUsage;
    }
    if ((cmd == "submit" || cmd == "logs" || cmd == "cancel" || cmd == "dump") && !need(2)) {
      return kUsage;
    }
    // Validate what is local before dialing (a bad option value or spec path fails fast).
    int limit = 0, tail = 0, rank = -1;
    for (auto [flag, out] : {std::pair<const char*, int*>{"--limit", &limit}, {"--tail", &tail},
                             {"--rank", &rank}}) {
      if (a_.Has(flag) && (!absl::SimpleAtoi(a_.Get(flag), out) || *out < 0)) {
        std::cerr << "emberctl: " << flag << " needs a number >= 0, not '" << a_.Get(flag)
                  << "'\n";
        return kUsage;
      }
    }
    std::string yaml;
    std::map<std::string, std::string> files;
    if (cmd == "submit") {
      absl::Status s = ReadSpec(UserPath(p[1]), 0, &yaml, &files);
      if (!s.ok()) return Fail(s);
    }
    auto c = Connect();
    if (!c.ok()) return Fail(c.status());
    if (cmd == "submit") {
      auto r = c->Submit(yaml, a_.Get("--id"), files);
      if (!r.ok()) return Fail(r.status());
      if (json_) std::cout << ToJson(*r) << "\n";
      else std::cout << r->job().id() << (r->already_existed() ? " (already submitted)" : "") << "\n";
      if (a_.Has("--follow")) return Follow(*c, r->job().id());
      return kOk;
    }
    if (cmd == "status" && p.size() >= 2) {
      auto j = c->Get(p[1]);
      if (!j.ok()) return Fail(j.status());
      PrintJob(*j, true);
      return kOk;
    }
    if (cmd == "status" || cmd == "list") {
      auto jobs = c->List(cmd == "status", limit);
      if (!jobs.ok()) return Fail(jobs.status());
      if (json_) {
        v1::ListJobsResponse r;
        for (auto& j : *jobs) *r.add_jobs() = j;
        std::cout << ToJson(r) << "\n";
      } else {
        if (jobs->empty()) std::cout << "no jobs\n";
        for (auto& j : *jobs) PrintJob(j, false);
      }
      return kOk;
    }
    if (cmd == "logs") {
      absl::Status s = c->StreamLogs(p[1], rank, a_.Has("--follow"), tail,
                                     [&](const v1::LogLine& l) {
        if (json_) std::cout << ToJson(l) << "\n";
        else if (rank >= 0) std::cout << l.line() << "\n";
        else std::cout << "[" << l.rank() << "] " << l.line() << "\n";
        std::cout.flush();
        return !interrupted_;
      });
      return s.ok() ? kOk : Fail(s);
    }
    if (cmd == "cancel") {
      auto j = c->Cancel(p[1]);
      if (!j.ok()) return Fail(j.status());
      PrintJob(*j, false);
      return kOk;
    }
    if (cmd == "dump") {
      auto d = c->Dump(p[1]);
      if (!d.ok()) return Fail(d.status());
      if (json_) std::cout << ToJson(*d) << "\n";
      else std::cout << "dump requested (attempt " << d->attempt() << "); ranks write to "
                     << d->directory() << "\nthen: emberctl fr analyze " << d->directory() << "\n";
      return kOk;
    }
    if (cmd == "nodes") {
      auto nodes = c->Nodes();
      if (!nodes.ok()) return Fail(nodes.status());
      if (json_) {
        v1::ListNodesResponse r;
        for (auto& n : *nodes) *r.add_nodes() = n;
        std::cout << ToJson(r) << "\n";
        return kOk;
      }
      for (const auto& n : *nodes) {
        std::cout << absl::StrFormat("%-20s %-22s %s  %d workers  mem %.1f/%.1f GiB free\n",
                                     n.name(), n.address(),
                                     n.draining() ? "draining" : n.healthy() ? "healthy" : "stale",
                                     n.workers(), n.memory_available_bytes() / 1073741824.0,
                                     n.memory_total_bytes() / 1073741824.0);
        for (const auto& d : n.devices()) {
          std::cout << "  " << absl::StrFormat("%-8s", d.id())
                    << (d.job_id().empty() ? "free" : d.job_id());
          if (d.has_gpu()) {
            const auto& g = d.gpu();
            std::cout << absl::StrFormat("  %s %.1f/%.1f GiB %d%% %.0f W %d MHz %d C", g.name(),
                                         g.memory_used_bytes() / 1073741824.0,
                                         g.memory_total_bytes() / 1073741824.0,
                                         g.utilization_pct(), g.power_mw() / 1000.0,
                                         g.sm_clock_mhz(), g.temperature_c());
          }
          std::cout << "\n";
        }
      }
      return kOk;
    }
    return kUsage;
  }

  int RunStandalone() {
    const auto& p = a_.positional;
    if (!a_.Has("--standalone") || p.size() < 2) {
      std::cerr << CommandHelp().at("run");
      return kUsage;
    }
    int nproc = 0;
    if (a_.Has("--nproc") && (!absl::SimpleAtoi(a_.Get("--nproc"), &nproc) || nproc < 1)) {
      std::cerr << "emberctl: --nproc needs a positive number\n";
      return kUsage;
    }
    std::string yaml;
    std::map<std::string, std::string> files;
    absl::Status s = ReadSpec(UserPath(p[1]), nproc, &yaml, &files);
    if (!s.ok()) return Fail(s);
    ember::StandaloneOptions so;
    so.work_root = UserPath(a_.Get("--work-root", "ember-jobs"));
    so.worker_binary = a_.Get("--worker");
    so.argv0 = argv0_;
    so.ranks = nproc;
    if (a_.Has("--max-ranks") &&
        (!absl::SimpleAtoi(a_.Get("--max-ranks"), &so.max_ranks) || so.max_ranks < 1)) {
      std::cerr << "emberctl: --max-ranks needs a positive number\n";
      return kUsage;
    }
    // SIGTERM and SIGHUP clean up like Ctrl-C: cancel the job, stop the workers, exit.
    for (int sig : {SIGTERM, SIGHUP}) {
      struct sigaction sa = {};
      sa.sa_handler = OnInterrupt;
      sigaction(sig, &sa, nullptr);
    }
    auto cluster = ember::StandaloneCluster::Start(so, yaml);
    if (!cluster.ok()) return Fail(cluster.status());
    auto c = (*cluster)->Connect();
    if (!c.ok()) return Fail(c.status());
    auto r = c->Submit(yaml, "", files);
    if (!r.ok()) return Fail(r.status());
    if (!json_) {
      std::cerr << "emberctl: running " << r->job().id() << " (" << r->job().world_size()
                << " ranks, logs in " << r->job().job_dir() << "/logs)\n";
    }
    // Follow notices a signal only when a progress update arrives; a job that makes none (still
    // starting, or hung) is cancelled from here, which ends the stream.
    absl::Notification followed;
    std::thread watch([&] {
      while (!followed.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
        if (interrupted_) {
          (void)c->Cancel(r->job().id());
          return;
        }
      }
    });
    int rc = Follow(*c, r->job().id());
    followed.Notify();
    watch.join();
    return rc;
  }

  static void OnInterrupt(int) { interrupted_ = true; }

  static std::atomic<bool> interrupted_;
  std::string argv0_;

 private:
  Args a_;
  bool json_;
};

std::atomic<bool> Ctl::interrupted_{false};

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(getenv("EMBER_DEBUG") ? spdlog::level::info : spdlog::level::warn);
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa = {};
  sa.sa_handler = Ctl::OnInterrupt;
  sigaction(SIGINT, &sa, nullptr);
  Args a;
  std::string err;
  if (!Parse(argc, argv, &a, &err)) {
    std::cerr << "emberctl: " << err << "\n";
    return kUsage;
  }
  std::string out = a.Get("--output", "text");
  if (out != "text" && out != "json") {
    std::cerr << "emberctl: --output must be text or json\n";
    return kUsage;
  }
  Ctl ctl(std::move(a));
  ctl.argv0_ = argv[0];
  return ctl.Run();
}
