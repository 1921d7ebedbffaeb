// emberctl's job commands: run --standalone, submit, status, list, logs, cancel, dump.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
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
#include "launcher/cli.h"
#include "launcher/standalone.h"
#include "runtime/base/status_macros.h"
#include "runtime/jobspec/spec.h"
#include "runtime/jobspec/yaml_proto.h"
#include "yaml-cpp/yaml.h"

namespace ember::cli {
namespace {

namespace v1 = ::ember::jobs::v1;
namespace fs = std::filesystem;

std::string ProgressLine(const v1::Progress& p) {
  const v1::StepMetrics& m = p.metrics();
  if (m.step() == 0) return "";
  std::string eta = p.eta_s() > 0 ? absl::StrFormat(" eta %.0fs", p.eta_s()) : "";
  return absl::StrFormat("step %d/%d loss %.4f %.0f tok/s%s", m.step(), p.steps(), m.loss(),
                         m.tokens_per_s(), eta);
}

void PrintJob(const Ctl& ctl, const v1::Job& j, bool detail) {
  if (ctl.json()) {
    std::cout << Ctl::ToJson(j) << "\n";
    return;
  }
  std::cout << absl::StrFormat("%-32s %-10s %d x %s  %s", j.id(), v1::JobState_Name(j.state()),
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

int ExitFor(v1::JobState s) {
  return s == v1::SUCCEEDED ? kOk : s == v1::CANCELLED ? kCancelled : kJobFailed;
}

}  // namespace

int Follow(Ctl& ctl, Client& c, const std::string& id, bool cancel_on_interrupt) {
  const bool tty = isatty(2), json = ctl.json();
  v1::JobState last_state = v1::JOB_STATE_UNSPECIFIED;
  int64_t last_step = -1;
  absl::Status s = c.StreamMetrics(id, true, 250, [&](const v1::MetricsUpdate& u) {
    if (json) {
      std::cout << Ctl::ToJson(u) << "\n" << std::flush;
    } else {
      std::string line = absl::StrCat("[", v1::JobState_Name(u.state()), "] ");
      auto it = u.ranks().find(0);
      if (it != u.ranks().end()) line += ProgressLine(it->second);
      if (tty) {
        std::cerr << "\r\033[K" << line << std::flush;
      } else if (u.state() != last_state ||
                 (it != u.ranks().end() && it->second.metrics().step() / 10 != last_step / 10)) {
        std::cerr << line << "\n";  // not a terminal: a line per state change / 10 steps
      }
      if (it != u.ranks().end()) last_step = it->second.metrics().step();
    }
    last_state = u.state();
    return !cancel_on_interrupt || !Interrupted();
  });
  if (tty && !json) std::cerr << "\n";
  if (cancel_on_interrupt && Interrupted()) {
    std::cerr << "emberctl: interrupted; cancelling " << id << "\n";
    (void)c.Cancel(id);
  }
  if (!s.ok()) return ctl.Fail(s);
  auto job = c.Wait(id, absl::Seconds(30));
  if (!job.ok()) return ctl.Fail(job.status());
  if (!json) PrintJob(ctl, *job, job->state() != v1::SUCCEEDED);
  return ExitFor(job->state());
}

namespace {

// Reads and parses a spec (once: what is submitted is this parsed spec, spec::ToYaml) and the
// small relative files its fields name, uploaded into the job directory: data.path,
// data.text_path, checkpoint.init_from_safetensors, worker.script, and the files of the
// checkpoint.init_from directory. --nproc sets parallelism.world_size.
absl::Status ReadSpec(const std::string& path, int nproc, spec::JobSpec* spec,
                      std::map<std::string, std::string>* files) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  auto parsed = spec::ParseJobSpec(ss.str(), nproc);
  if (!parsed.ok()) return base::Annotate(parsed.status(), path);
  *spec = *std::move(parsed);
  const fs::path base = fs::absolute(path).parent_path();
  auto relative = [](const std::string& rel) { return !rel.empty() && rel[0] != '/' && !absl::StrContains(rel, ".."); };
  auto upload = [&](const std::string& rel) {
    if (!relative(rel)) return;
    fs::path p = base / rel;
    std::error_code ec;
    if (!fs::is_regular_file(p, ec) || fs::file_size(p, ec) > (8u << 20)) return;
    std::ifstream in(p, std::ios::binary);
    std::stringstream b;
    b << in.rdbuf();
    (*files)[rel] = b.str();
  };
  upload(spec->data().path());
  upload(spec->data().text_path());
  upload(spec->checkpoint().init_from_safetensors());
  upload(spec->worker().script());
  // checkpoint.init_from names a Hugging Face directory: its files (config.json, the safetensors,
  // the index) go up when each is small; larger models belong under an emberd --data-root.
  if (const std::string& rel = spec->checkpoint().init_from(); relative(rel)) {
    std::error_code ec;
    if (fs::is_directory(base / rel, ec)) {
      for (const auto& e : fs::directory_iterator(base / rel, ec)) {
        if (!e.is_regular_file(ec) || e.file_size(ec) > (8u << 20)) continue;
        std::ifstream in(e.path(), std::ios::binary);
        std::stringstream b;
        b << in.rdbuf();
        (*files)[rel + "/" + e.path().filename().string()] = b.str();
      }
    }
  }
  return absl::OkStatus();
}

// A script given directly (`run --standalone train.py -- ARGS`): the spec a user would write for
// it, with the script uploaded under its base name.
absl::Status ScriptSpec(const Ctl& ctl, const std::string& path, int nproc, spec::JobSpec* spec,
                        std::map<std::string, std::string>* files) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream b;
  b << in.rdbuf();
  const std::string base = fs::path(path).filename().string();
  (*files)[base] = b.str();
  const Args& a = ctl.args();
  std::string name = a.Get("--name");
  if (name.empty()) {  // the script's name, as a job name allows it
    for (char ch : fs::path(path).stem().string()) {
      name += (isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-') ? ch : '_';
    }
    if (name.empty() || !isalnum(static_cast<unsigned char>(name[0]))) name = "script-" + name;
    name = name.substr(0, 63);
  }
  int restarts = 0;
  if (a.Has("--max-restarts") && (!absl::SimpleAtoi(a.Get("--max-restarts"), &restarts) || restarts < 0)) {
    return absl::InvalidArgumentError("--max-restarts needs a number >= 0");
  }
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << name;
  out << YAML::Key << "worker" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "script" << YAML::Value << base;
  out << YAML::Key << "python" << YAML::Value << a.Get("--python", "/usr/bin/python3");
  out << YAML::Key << "args" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const std::string& arg : a.passthrough) out << YAML::DoubleQuoted << arg;
  out << YAML::EndSeq << YAML::EndMap;
  out << YAML::Key << "parallelism" << YAML::Value << YAML::BeginMap << YAML::Key << "world_size"
      << YAML::Value << std::max(1, nproc) << YAML::EndMap;
  out << YAML::Key << "resources" << YAML::Value << YAML::BeginMap << YAML::Key << "device_type"
      << YAML::Value << "cpu" << YAML::EndMap;
  out << YAML::Key << "max_restarts" << YAML::Value << restarts << YAML::EndMap;
  ASSIGN_OR_RETURN(*spec, spec::ParseJobSpec(out.c_str()));
  return absl::OkStatus();
}

}  // namespace

bool IsScriptPath(const std::string& path) { return absl::EndsWith(path, ".py"); }

// The job of `run`/`submit`: a spec file, or a script (then ARGS after "--" are its arguments).
absl::Status ReadJob(const Ctl& ctl, int nproc, spec::JobSpec* spec,
                     std::map<std::string, std::string>* files) {
  const std::string path = Ctl::UserPath(ctl.rest()[0]);
  if (IsScriptPath(path)) return ScriptSpec(ctl, path, nproc, spec, files);
  for (const char* o : {"--python", "--max-restarts", "--name"}) {
    if (ctl.args().Has(o)) {
      return absl::InvalidArgumentError(absl::StrCat(o, " is for a script (.py); set it in the spec"));
    }
  }
  if (!ctl.args().passthrough.empty()) {
    return absl::InvalidArgumentError("arguments after -- are for a script (.py); use worker.args");
  }
  return ReadSpec(path, nproc, spec, files);
}

namespace {

void PrintJobs(const Ctl& ctl, const std::vector<v1::Job>& jobs) {
  if (ctl.json()) {
    v1::ListJobsResponse r;
    for (const auto& j : jobs) *r.add_jobs() = j;
    std::cout << Ctl::ToJson(r) << "\n";
    return;
  }
  if (jobs.empty()) std::cout << "no jobs\n";
  for (const auto& j : jobs) PrintJob(ctl, j, false);
}

}  // namespace

int RunStandalone(Ctl& ctl) {
  const Args& a = ctl.args();
  if (a.Has("--slurm")) return RunSlurm(ctl);
  if (!a.Has("--standalone")) {
    std::cerr << CommandHelp("run");
    return kUsage;
  }
  int nproc = 0;
  if (!ctl.IntOption("--nproc", 1, &nproc)) return kUsage;
  spec::JobSpec spec;
  std::map<std::string, std::string> files;
  absl::Status s = ReadJob(ctl, nproc, &spec, &files);
  if (!s.ok()) return ctl.Fail(s);
  StandaloneOptions so;
  so.allow_root_scripts = a.Has("--allow-root-scripts");
  so.script_user = a.Get("--script-user");
  so.reap_orphans = true;  // a rank's daemonised descendant ends with the run (issue 31)
  so.work_root = Ctl::UserPath(a.Get("--work-root", "ember-jobs"));
  so.worker_binary = a.Get("--worker");
  so.argv0 = ctl.argv0();
  so.ranks = nproc;
  if (!ctl.IntOption("--max-ranks", 1, &so.max_ranks)) return kUsage;
  if (!ctl.IntOption("--emulate-gpus", 1, &so.emulate_gpus)) return kUsage;
  so.http_listen = a.Get("--http");
  // SIGTERM and SIGHUP clean up like Ctrl-C: cancel the job, stop the workers, exit.
  for (int sig : {SIGTERM, SIGHUP}) {
    struct sigaction sa = {};
    sa.sa_handler = OnInterrupt;
    sigaction(sig, &sa, nullptr);
  }
  auto cluster = StandaloneCluster::Start(so, spec);
  if (!cluster.ok()) return ctl.Fail(cluster.status());
  auto c = (*cluster)->Connect();
  if (!c.ok()) return ctl.Fail(c.status());
  auto r = c->Submit(spec::ToYaml(spec), "", files);
  if (!r.ok()) return ctl.Fail(r.status());
  if ((*cluster)->root_script()) {  // one line, also with --json (on stderr)
    std::cerr << "emberctl: the script runs as root, as emberctl does (a standalone run is your own "
                 "script on this machine; --script-user NAME runs it as NAME)\n";
  }
  if (!ctl.json()) {
    std::cerr << "emberctl: running " << r->job().id() << " (" << r->job().world_size()
              << " ranks, logs in " << r->job().job_dir() << "/logs)\n";
    if (!(*cluster)->http_address().empty()) {
      std::cerr << "emberctl: job page at http://" << (*cluster)->http_address() << "/jobs/"
                << r->job().id() << "\n";
    }
  }
  // Follow notices a signal only when a progress update arrives; a job that makes none (still
  // starting, or hung) is cancelled from here, which ends the stream.
  absl::Notification followed;
  std::thread watch([&] {
    while (!followed.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
      if (Interrupted()) {
        (void)c->Cancel(r->job().id());
        return;
      }
    }
  });
  int rc = Follow(ctl, *c, r->job().id());
  followed.Notify();
  watch.join();
  return rc;
}

int RunSubmit(Ctl& ctl) {
  // The spec is read before dialing: a bad path fails fast.
  int nproc = 0;
  if (!ctl.IntOption("--nproc", 1, &nproc)) return kUsage;
  if (nproc > 0 && !IsScriptPath(ctl.rest()[0])) {
    return ctl.UsageError("--nproc is for a script (.py); set parallelism.world_size in the spec");
  }
  spec::JobSpec spec;
  std::map<std::string, std::string> files;
  absl::Status s = ReadJob(ctl, nproc, &spec, &files);
  if (!s.ok()) return ctl.Fail(s);
  auto c = ctl.Connect();
  if (!c.ok()) return ctl.Fail(c.status());
  auto r = c->Submit(spec::ToYaml(spec), ctl.args().Get("--id"), files);
  if (!r.ok()) return ctl.Fail(r.status());
  if (ctl.json()) std::cout << Ctl::ToJson(*r) << "\n";
  else std::cout << r->job().id() << (r->already_existed() ? " (already submitted)" : "") << "\n";
  if (ctl.args().Has("--follow")) return Follow(ctl, *c, r->job().id());
  return kOk;
}

int RunStatus(Ctl& ctl) {
  auto c = ctl.Connect();
  if (!c.ok()) return ctl.Fail(c.status());
  if (!ctl.rest().empty()) {
    auto j = c->Get(ctl.rest()[0]);
    if (!j.ok()) return ctl.Fail(j.status());
    PrintJob(ctl, *j, true);
    return kOk;
  }
  auto jobs = c->List(/*active_only=*/true, 0);
  if (!jobs.ok()) return ctl.Fail(jobs.status());
  PrintJobs(ctl, *jobs);
  return kOk;
}

int RunList(Ctl& ctl) {
  int limit = 0;
  if (!ctl.IntOption("--limit", 0, &limit)) return kUsage;
  auto c = ctl.Connect();
  if (!c.ok()) return ctl.Fail(c.status());
  auto jobs = c->List(/*active_only=*/false, limit);
  if (!jobs.ok()) return ctl.Fail(jobs.status());
  PrintJobs(ctl, *jobs);
  return kOk;
}

int RunLogs(Ctl& ctl) {
  int tail = 0, rank = -1;
  if (!ctl.IntOption("--tail", 0, &tail) || !ctl.IntOption("--rank", 0, &rank)) return kUsage;
  auto c = ctl.Connect();
  if (!c.ok()) return ctl.Fail(c.status());
  absl::Status s = c->StreamLogs(ctl.rest()[0], rank, ctl.args().Has("--follow"), tail,
                                 [&](const v1::LogLine& l) {
    if (ctl.json()) std::cout << Ctl::ToJson(l) << "\n";
    else if (rank >= 0) std::cout << l.line() << "\n";
    else std::cout << "[" << l.rank() << "] " << l.line() << "\n";
    std::cout.flush();
    return !Interrupted();
  });
  return s.ok() ? kOk : ctl.Fail(s);
}

int RunCancel(Ctl& ctl) {
  int wait_s = 300;
  if (!ctl.IntOption("--wait", 1, &wait_s)) return kUsage;
  auto c = ctl.Connect();
  if (!c.ok()) return ctl.Fail(c.status());
  const std::string& id = ctl.rest()[0];
  const bool checkpoint = ctl.args().Has("--checkpoint");
  auto j = c->Cancel(id, checkpoint);
  if (!j.ok()) return ctl.Fail(j.status());
  if (checkpoint && j->state() == jobs::v1::RUNNING) {
    // The ranks checkpoint the next step they all reach, then exit; the daemon marks the job.
    if (!ctl.json()) std::cerr << "emberctl: job " << id << ": checkpoint requested; waiting up to " << wait_s << " s\n";
    auto ended = [](jobs::v1::JobState st) {
      return st == jobs::v1::SUCCEEDED || st == jobs::v1::FAILED || st == jobs::v1::CANCELLED;
    };
    const absl::Time deadline = absl::Now() + absl::Seconds(wait_s);
    while (absl::Now() < deadline && !Interrupted()) {
      absl::SleepFor(absl::Milliseconds(200));
      auto now = c->Get(id);
      if (now.ok()) j = std::move(now);
      if (ended(j->state())) break;
    }
    if (!ended(j->state())) {
      std::cerr << "emberctl: job " << id << " did not checkpoint within " << wait_s
                << " s; cancelling without a checkpoint (raise --wait for a slow step)\n";
      auto plain = c->Cancel(id, false);
      if (!plain.ok()) return ctl.Fail(plain.status());
      PrintJob(ctl, *plain, false);
      return kOther;
    }
  }
  PrintJob(ctl, *j, false);
  return kOk;
}

int RunDump(Ctl& ctl) {
  auto c = ctl.Connect();
  if (!c.ok()) return ctl.Fail(c.status());
  auto d = c->Dump(ctl.rest()[0]);
  if (!d.ok()) return ctl.Fail(d.status());
  if (ctl.json()) std::cout << Ctl::ToJson(*d) << "\n";
  else std::cout << "dump requested (attempt " << d->attempt() << "); ranks write to "
                 << d->directory() << "\nthen: emberctl fr analyze " << d->directory() << "\n";
  return kOk;
}

}  // namespace ember::cli
