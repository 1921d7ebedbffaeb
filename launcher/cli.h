// emberctl's command table and what every handler shares: parsed arguments, exit codes, output
// helpers (text or --output json), the connection to emberd. Used only by //launcher:emberctl.
//
// A command is one row of the table in emberctl.cc (name, optional subcommand, usage, options,
// handler); `emberctl help`, `emberctl --help` and `emberctl CMD --help` print text generated from
// it, and an option a row does not list is a usage error (exit 2). Adding a command:
//
//   int RunPipelineShow(Ctl& ctl);   // here, implemented in cmd_pipeline.cc
//   {"pipeline", "show", "pipeline show JOB.yaml", "print the pipeline schedule", "", 1,
//    {{"--json", "", "JSON output"}}, RunPipelineShow},   // a row in emberctl.cc
//
// Thread-compatible: one Ctl per process; Interrupted() is the only state signal handlers touch.
#ifndef EMBER_LAUNCHER_CLI_H_
#define EMBER_LAUNCHER_CLI_H_

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "launcher/client.h"
#include "runtime/jobspec/spec.h"

namespace ember::cli {

// Exit codes (stable, for scripts; emberctl.cc's banner says what each means).
enum Exit { kOk = 0, kJobFailed = 1, kUsage = 2, kUnreachable = 3, kAuth = 4, kNotFound = 5,
            kCancelled = 6, kOther = 7, kRequeued = 8 };

struct Option {
  const char* name;  // "--rank"
  const char* arg;   // "R" for an option that takes a value, "" for a switch
  const char* help;  // one line
};

// The options every command accepts (--address, --token-file, TLS files, --output, --help).
const std::vector<Option>& GlobalOptions();

struct Args {
  std::vector<std::string> positional;       // the command (and subcommand) first
  std::map<std::string, std::string> opts;   // "--x" -> value ("" for switches)
  std::vector<std::string> passthrough;      // everything after "--", as given (a script's args)
  bool Has(const std::string& k) const { return opts.count(k) > 0; }
  std::string Get(const std::string& k, const std::string& def = "") const {
    auto it = opts.find(k);
    return it == opts.end() ? def : it->second;
  }
};

class Ctl;

// One row of the command table. `usage` follows "usage: emberctl "; `details` (several lines,
// each starting with two spaces) follows the usage line in `emberctl CMD --help`, then the options.
struct Command {
  const char* name;         // "ckpt"
  const char* sub;          // "inspect", or "" for a command without subcommands
  const char* usage;        // "ckpt inspect PATH [--verify]"
  const char* summary;      // one line for the command list
  const char* details;
  size_t min_args;          // positional arguments after the (sub)command; fewer prints the usage
  std::vector<Option> options;
  int (*run)(Ctl& ctl);
  bool passthrough = false;  // takes arguments after "--" (Args::passthrough)
};

// The table (emberctl.cc).
const std::vector<Command>& Commands();

// Generated help: the command list with the global options and exit codes; one command's rows.
std::string TopHelp();
std::string CommandHelp(const std::string& name);

// Splits argv into options and positional arguments (-f = --follow, -h = --help; an option any
// row lists with an argument takes the next word or "=VALUE"). False with *err on a missing value.
bool ParseArgs(int argc, char** argv, Args* a, std::string* err);

// Set by SIGINT (and, for `run`, SIGTERM/SIGHUP); long-running handlers poll it.
std::atomic<bool>& Interrupted();
void OnInterrupt(int);

// What a handler gets: the arguments, the output mode and the shared helpers.
class Ctl {
 public:
  Ctl(Args a, std::string argv0);

  const Args& args() const { return a_; }
  // Positional arguments after the command and subcommand (rest()[0] is the first operand).
  const std::vector<std::string>& rest() const { return rest_; }
  bool json() const { return json_; }
  const std::string& argv0() const { return argv0_; }

  // Prints the error (text on stderr, or a JSON object on stdout) and returns its exit code:
  // INVALID_ARGUMENT/PERMISSION_DENIED/FAILED_PRECONDITION 2, UNAVAILABLE/DEADLINE_EXCEEDED 3,
  // UNAUTHENTICATED 4, NOT_FOUND 5, anything else 7.
  int Fail(const absl::Status& s);
  // "emberctl: MESSAGE" on stderr; returns kUsage.
  int UsageError(const std::string& message);
  // Parses option `flag` as an integer >= min into *out (untouched when absent); false after
  // printing "emberctl: FLAG ..." when the value is not one.
  bool IntOption(const char* flag, int min, int* out);

  // A client for --address/$EMBER_ADDRESS with the token file and TLS options (exit 4 problems
  // are UNAUTHENTICATED).
  absl::StatusOr<Client> Connect();

  static std::string Quote(const std::string& s);  // a JSON string literal
  static std::string ToJson(const google::protobuf::Message& m);
  // Relative paths are the user's: under `bazel run`, $BUILD_WORKING_DIRECTORY.
  static std::string UserPath(const std::string& p);

  // Dispatches to the table: help, unknown commands and options, missing arguments.
  int Run();

 private:
  Args a_;
  std::vector<std::string> rest_;
  bool json_;
  std::string argv0_;
};

// Handlers, by area.
// cmd_jobs.cc
int RunStandalone(Ctl& ctl);
int RunSubmit(Ctl& ctl);
int RunStatus(Ctl& ctl);
int RunList(Ctl& ctl);
int RunLogs(Ctl& ctl);
int RunCancel(Ctl& ctl);
int RunDump(Ctl& ctl);
// Shared with cmd_slurm.cc: follows a job with the live progress line until it ends and returns
// the exit code for its state; reads the job of `run`/`submit` (a spec, or a .py script) from
// rest()[0] with the small files it names. `cancel_on_interrupt`: a signal (Interrupted()) stops
// the following and cancels the job; false when the caller stops the job itself (`run --slurm`:
// a time-limit warning drains to a checkpoint, which a plain cancel here would race and lose).
int Follow(Ctl& ctl, Client& c, const std::string& id, bool cancel_on_interrupt = true);
bool IsScriptPath(const std::string& path);
absl::Status ReadJob(const Ctl& ctl, int nproc, spec::JobSpec* spec,
                     std::map<std::string, std::string>* files);
// cmd_slurm.cc
int RunSlurm(Ctl& ctl);          // run --slurm
int RunSlurmNode(Ctl& ctl);      // slurm node (what run --slurm starts with srun on each node)
int RunSlurmSbatch(Ctl& ctl);    // slurm sbatch
// cmd_nodes.cc
int RunNodes(Ctl& ctl);
// cmd_fr.cc
int RunFrAnalyze(Ctl& ctl);
// cmd_ckpt.cc
int RunCkptInspect(Ctl& ctl);
int RunCkptExport(Ctl& ctl);
// cmd_pipeline.cc
int RunPipelineShow(Ctl& ctl);
// cmd_plot.cc
int RunPlot(Ctl& ctl);
int RunTop(Ctl& ctl);
// cmd_weights.cc
int RunWeightsSubscribe(Ctl& ctl);

}  // namespace ember::cli

#endif  // EMBER_LAUNCHER_CLI_H_
