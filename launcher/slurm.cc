#include "launcher/slurm.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ember::slurm {

absl::StatusOr<std::vector<int>> ParseCpusPerNode(const std::string& s) {
  std::vector<int> out;
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "SLURM_JOB_CPUS_PER_NODE: '", s, "' is not a CPU list like 4(x2),2; run inside an sbatch "
        "or salloc allocation"));
  };
  if (s.empty()) return bad();
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int count = 1, cpus = 0;
    size_t paren = part.find('(');
    absl::string_view n = part.substr(0, paren);
    if (paren != absl::string_view::npos) {
      absl::string_view rep = part.substr(paren);
      if (!absl::ConsumePrefix(&rep, "(x") || !absl::ConsumeSuffix(&rep, ")") ||
          !absl::SimpleAtoi(rep, &count) || count < 1) {
        return bad();
      }
    }
    if (!absl::SimpleAtoi(n, &cpus) || cpus < 1) return bad();
    out.insert(out.end(), count, cpus);
  }
  return out;
}

int GpusPerNode(const std::function<std::string(const char*)>& env) {
  int n = 0;
  if (absl::SimpleAtoi(env("SLURM_GPUS_ON_NODE"), &n) && n > 0) return n;
  std::string per = env("SLURM_GPUS_PER_NODE");  // "2" or "a100:2"
  if (size_t colon = per.rfind(':'); colon != std::string::npos) per = per.substr(colon + 1);
  if (absl::SimpleAtoi(per, &n) && n > 0) return n;
  if (!env("SLURM_JOB_GPUS").empty()) {
    std::string vis = env("CUDA_VISIBLE_DEVICES");
    if (!vis.empty()) return static_cast<int>(std::vector<std::string>(absl::StrSplit(vis, ',')).size());
  }
  return 0;
}

absl::StatusOr<SlurmAllocation> AllocationFromEnv(
    const std::function<std::string(const char*)>& env,
    const std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>& hostnames) {
  SlurmAllocation a;
  a.job_id = env("SLURM_JOB_ID");
  if (a.job_id.empty()) {
    return absl::FailedPreconditionError(
        "run --slurm: SLURM_JOB_ID is not set: not inside a Slurm allocation; run it from an sbatch "
        "script or an salloc shell (emberctl slurm sbatch SPEC writes one)");
  }
  const std::string list = env("SLURM_JOB_NODELIST");
  if (list.empty()) {
    return absl::InvalidArgumentError("run --slurm: SLURM_JOB_NODELIST is empty in allocation " +
                                      a.job_id);
  }
  auto names = hostnames(list);
  if (!names.ok()) return names.status();
  a.nodes = *names;
  int nnodes = 0;
  if (!absl::SimpleAtoi(env("SLURM_NNODES"), &nnodes) || nnodes != static_cast<int>(a.nodes.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "run --slurm: SLURM_NNODES='", env("SLURM_NNODES"), "' but SLURM_JOB_NODELIST=", list,
        " names ", a.nodes.size(), " nodes"));
  }
  std::string cpn = env("SLURM_JOB_CPUS_PER_NODE");
  if (cpn.empty() && !env("SLURM_CPUS_ON_NODE").empty()) {
    cpn = absl::StrCat(env("SLURM_CPUS_ON_NODE"), "(x", nnodes, ")");  // homogeneous
  }
  auto cpus = ParseCpusPerNode(cpn);
  if (!cpus.ok()) return cpus.status();
  if (static_cast<int>(cpus->size()) != nnodes) {
    return absl::InvalidArgumentError(absl::StrCat("run --slurm: SLURM_JOB_CPUS_PER_NODE=", cpn,
                                                   " counts ", cpus->size(), " nodes, not ", nnodes));
  }
  a.cpus = *cpus;
  a.gpus_per_node = GpusPerNode(env);
  return a;
}

absl::StatusOr<std::vector<int>> PlanRanks(const SlurmAllocation& a, int world_size, bool cuda) {
  const int n = static_cast<int>(a.nodes.size());
  std::vector<int> cap(n);
  int total = 0;
  for (int i = 0; i < n; ++i) {
    cap[i] = cuda ? a.gpus_per_node : a.cpus[i];
    total += cap[i];
  }
  if (world_size > total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.world_size: the job asks for ", world_size, " ranks but Slurm allocation ",
        a.job_id, " holds ", total, " ",
        cuda ? absl::StrCat("GPUs (", n, " nodes x ", a.gpus_per_node, " GPUs)")
             : absl::StrCat("CPUs (", n, " nodes: ", absl::StrJoin(a.cpus, ","), ")"),
        "; lower world_size or allocate more (",
        cuda ? "--nodes / --gpus-per-node" : "--nodes / --ntasks-per-node", ")"));
  }
  std::vector<int> per(n, 0);
  for (int r = 0; r < world_size;) {
    for (int i = 0; i < n && r < world_size; ++i) {
      if (per[i] < cap[i]) {
        ++per[i];
        ++r;
      }
    }
  }
  return per;
}

namespace {

// Runs argv (no shell), returns its stdout; UNAVAILABLE with its output when it fails.
absl::StatusOr<std::string> Capture(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const auto& a : argv) {
    cmd += "'";
    for (char c : a) cmd += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += "' ";
  }
  cmd += "2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return absl::UnavailableError(absl::StrCat("cannot run ", argv[0]));
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
  int st = pclose(p);
  if (st != 0) {
    return absl::UnavailableError(absl::StrCat(absl::StrJoin(argv, " "), " failed (status ",
                                               WIFEXITED(st) ? WEXITSTATUS(st) : st, "): ",
                                               absl::StripAsciiWhitespace(out),
                                               "; is Slurm's client installed and SLURM_CONF set?"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostnames(const std::string& nodelist) {
  auto out = Capture({"scontrol", "show", "hostnames", nodelist});
  if (!out.ok()) return out.status();
  std::vector<std::string> names;
  for (absl::string_view l : absl::StrSplit(*out, '\n', absl::SkipWhitespace())) {
    names.emplace_back(absl::StripAsciiWhitespace(l));
  }
  if (names.empty()) return absl::InvalidArgumentError("no nodes in " + nodelist);
  return names;
}

absl::StatusOr<std::string> NodeAddress(const std::string& node) {
  auto out = Capture({"scontrol", "show", "node", node, "-o"});
  if (!out.ok()) return out.status();
  for (absl::string_view w : absl::StrSplit(*out, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&w, "NodeAddr=") && !w.empty()) return std::string(w);
  }
  return absl::NotFoundError(absl::StrCat("scontrol show node ", node, " has no NodeAddr"));
}

std::string NodeTrouble(const std::string& node) {
  // Called as Slurm signals the job's processes: an scontrol started just then may be killed by
  // the same SIGTERM, so a failure is retried.
  auto out = Capture({"scontrol", "show", "node", node, "-o"});
  for (int i = 0; i < 5 && !out.ok(); ++i) {
    usleep(100 * 1000);
    out = Capture({"scontrol", "show", "node", node, "-o"});
  }
  if (!out.ok()) return absl::StrCat("node ", node, ": state unknown (", out.status().message(), ")");
  std::string state, reason;
  for (absl::string_view w : absl::StrSplit(*out, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&w, "State=")) state = std::string(w);
    if (absl::ConsumePrefix(&w, "Reason=")) reason = std::string(w);
  }
  for (const char* bad : {"DOWN", "DRAIN", "FAIL", "NOT_RESPONDING"}) {
    if (absl::StrContains(state, bad)) {
      return absl::StrCat("node ", node, " is ", state, reason.empty() ? "" : " (Reason=" + reason + ")");
    }
  }
  return "";
}

std::string SbatchScript(const SbatchOptions& o) {
  auto q = [](const std::string& s) {  // single-quoted for the shell
    std::string r = "'";
    for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return r + "'";
  };
  std::string s = "#!/bin/bash\n# Written by `emberctl slurm sbatch`: Ember on Slurm (docs/operations.md).\n";
  absl::StrAppend(&s, "#SBATCH --job-name=", o.job_name, "\n");
  absl::StrAppend(&s, "#SBATCH --nodes=", o.nodes, "\n");
  absl::StrAppend(&s, "#SBATCH --ntasks-per-node=", o.ranks_per_node, "\n");
  if (o.gpus_per_node > 0) absl::StrAppend(&s, "#SBATCH --gpus-per-node=", o.gpus_per_node, "\n");
  if (!o.time.empty()) absl::StrAppend(&s, "#SBATCH --time=", o.time, "\n");
  if (!o.partition.empty()) absl::StrAppend(&s, "#SBATCH --partition=", o.partition, "\n");
  if (!o.output.empty()) absl::StrAppend(&s, "#SBATCH --output=", o.output, "\n");
  if (o.warn_before_s > 0) {
    absl::StrAppend(&s, "#SBATCH --signal=B:USR1@", o.warn_before_s, "\n#SBATCH --requeue\n",
                    "#SBATCH --open-mode=append\n");
  }
  // exec: the batch step's signals (scancel, preemption) reach emberctl itself.
  absl::StrAppend(&s, "exec ", q(o.emberctl), " run --slurm");
  if (!o.work_root.empty()) absl::StrAppend(&s, " --work-root ", q(o.work_root));
  absl::StrAppend(&s, " ", q(o.spec), "\n");
  return s;
}

}  // namespace ember::slurm
