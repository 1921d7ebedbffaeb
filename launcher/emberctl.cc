// emberctl: the Ember command line. `emberctl help` lists the commands; every command has --help.
// The commands are the table below; their handlers live in cmd_<area>.cc, what they share in
// cli.{h,cc}.
//
// Exit codes (stable, for scripts):
//   0  success (with --follow / run: the job SUCCEEDED)
//   1  the job FAILED (fr analyze: a problem was found; ckpt inspect --verify: damage found)
//   2  usage error (an unknown command or option, or a bad option value, for every command; a
//      missing argument), or the daemon rejected the request (bad spec: INVALID_ARGUMENT names the
//      field; PERMISSION_DENIED for a path outside the job directory)
//   3  the daemon is unreachable
//   4  authentication failed (missing or wrong token, or a token file that is missing, unreadable
//      or holds no token)
//   5  no such job
//   6  the job was CANCELLED
//   7  any other error
//   8  run --slurm: stopped on Slurm's time-limit warning (SIGUSR1) and requeued (scontrol requeue)
#include <signal.h>

#include <cstdlib>
#include <iostream>

#include "launcher/cli.h"
#include "spdlog/spdlog.h"

namespace ember::cli {

const std::vector<Command>& Commands() {
  static const auto* table = new std::vector<Command>{
      {"run", "", "run --standalone|--slurm [--nproc N] (JOB.yaml | SCRIPT.py [-- ARGS...])",
       "run a job or a PyTorch script on this machine, or across a Slurm allocation",
       "  Starts a store and a daemon inside emberctl with a one-time token, runs the job on\n"
       "  this machine with a live progress line, and exits with the job's result.\n"
       "  A .py file runs as a script job: N ranks of `python -u SCRIPT ARGS` with torchrun's\n"
       "  environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT, ...), restarted up to --max-restarts.\n"
       "  SIGINT, SIGTERM or SIGHUP cancel the job; the workers die with emberctl even on kill "
       "-9.\n"
       "  --slurm (inside sbatch or salloc): one ephemeral daemon per allocated node, started with\n"
       "  srun, the store on the first node, ranks spread over the nodes' CPUs or GPUs; a job\n"
       "  larger than the allocation is refused first. Exits with the job's exit code.\n",
       1,
       {{"--standalone", "", "no cluster, everything in this process"},
        {"--slurm", "", "inside a Slurm allocation: daemons on its nodes via srun"},
        {"--nproc", "N", "ranks (overrides parallelism.world_size)"},
        {"--max-ranks", "N", "allow up to N CPU ranks (default 4 x the online cores)"},
        {"--emulate-gpus", "N", "a cuda job on N emulated GPUs (CUDA interpreter; test build "
                                "ember-worker-cuda-interp)"},
        {"--work-root", "DIR", "job directories (default ./ember-jobs)"},
        {"--worker", "PATH", "the worker binary ($EMBER_WORKER; default: next to emberctl)"},
        {"--http", "HOST:PORT", "serve the job page there (no login: keep it on loopback)"},
        {"--python", "PATH", "script jobs: the interpreter (default /usr/bin/python3)"},
        {"--max-restarts", "N", "script jobs: restarts after a failure (default 0)"},
        {"--name", "NAME", "script jobs: the job name (default: the script's)"},
        {"--allow-root-scripts", "", "implied: a standalone run as root runs the script as root"},
        {"--script-user", "USER", "run as root: run the script as USER instead"}},
       RunStandalone, /*passthrough=*/true},
      {"slurm", "sbatch",
       "slurm sbatch (JOB.yaml | SCRIPT.py) [--nodes N] [--gpus-per-node G] [--time T] "
       "[--partition P] [--dry-run]",
       "write and submit the sbatch script that runs a job with `run --slurm`",
       "  The batch script a user would write: --nodes, --ntasks-per-node = the ranks per node\n"
       "  (world_size / nodes), --gpus-per-node for cuda jobs, then `emberctl run --slurm SPEC`.\n"
       "  --dry-run prints it; otherwise it is written as NAME.sbatch (--script-dir) and submitted\n"
       "  with sbatch, and the Slurm job id is printed. With --time it adds --signal=B:USR1@120,\n"
       "  --requeue and --open-mode=append: on the warning emberctl stops the job (its\n"
       "  checkpoints kept), requeues it, and the requeued run resumes from checkpoints/latest.\n",
       1,
       {{"--nodes", "N", "nodes (default 1)"},
        {"--gpus-per-node", "G", "cuda jobs: GPUs per node (default: the ranks per node)"},
        {"--time", "T", "time limit (sbatch --time)"},
        {"--partition", "P", "partition (sbatch --partition)"},
        {"--warn-before", "S", "with --time: SIGUSR1 S seconds before the limit stops the job at "
                               "its checkpoint and requeues it (default 120; 0 = off)"},
        {"--work-root", "DIR", "job directories, visible on every node (default ./ember-jobs)"},
        {"--out-file", "FILE", "the batch output (default NAME-%j.out)"},
        {"--script-dir", "DIR", "where NAME.sbatch is written (default .)"},
        {"--dry-run", "", "print the script, submit nothing"}},
       RunSlurmSbatch},
      {"slurm", "node", "slurm node --run-dir DIR --work-root DIR --worker PATH --ranks LIST [--cuda]",
       "internal: the per-node daemon that `run --slurm` starts with srun",
       "  An ephemeral emberd for one node of the allocation (node id SLURM_NODEID): the first\n"
       "  hosts the store. Runs until SIGTERM, then drains. Not for direct use.\n",
       0,
       {{"--run-dir", "DIR", "the run directory (token, rendezvous)"},
        {"--work-root", "DIR", "job directories"},
        {"--worker", "PATH", "the worker binary"},
        {"--ranks", "LIST", "ranks per node, by node id"},
        {"--cuda", "", "offer GPUs, not CPU slots"}},
       RunSlurmNode},
      {"submit", "", "submit (JOB.yaml | SCRIPT.py [-- ARGS...]) [--follow] [--id SID]",
       "submit to a cluster; --follow waits and exits with the result",
       "  Validates and queues the job. Data files named relatively in the spec are uploaded\n"
       "  into the job directory (8 MiB total). A .py file is a script job (see `run`);\n"
       "  whoever holds the cluster token runs code on the nodes this way.\n",
       1,
       {{"--follow", "", "stream progress and exit with the job's result (also -f)"},
        {"--id", "SID", "submission id: retries with the same id are idempotent"},
        {"--nproc", "N", "script jobs: ranks (default 1)"},
        {"--python", "PATH", "script jobs: the interpreter (default /usr/bin/python3)"},
        {"--max-restarts", "N", "script jobs: restarts after a failure (default 0)"},
        {"--name", "NAME", "script jobs: the job name (default: the script's)"}},
       RunSubmit, /*passthrough=*/true},
      {"status", "", "status [JOB]", "one job in detail, or the active jobs",
       "  One job with attempts, root cause and progress; without JOB the active jobs.\n", 0, {},
       RunStatus},
      {"list", "", "list [--all] [--limit N]", "jobs, newest first",
       "  Jobs, newest first (finished ones included).\n", 0,
       {{"--all", "", "include finished jobs (the default listing too)"},
        {"--limit", "N", "at most N jobs (0 = all)"}},
       RunList},
      {"logs", "", "logs JOB [-f] [--rank R] [--tail N]", "worker logs (every rank, or one)",
       "  Worker output; each line is prefixed with its rank when several are shown.\n", 1,
       {{"--follow", "", "keep printing new lines (also -f)"},
        {"--rank", "R", "only rank R"},
        {"--tail", "N", "the last N lines first"}},
       RunLogs},
      {"cancel", "", "cancel JOB [--checkpoint [--wait S]]", "stop every worker of the job",
       "  Stops every worker (SIGTERM, SIGKILL after the grace period) and frees its devices.\n"
       "  --checkpoint: the ranks first save a checkpoint of the next step they all reach (no\n"
       "  step lost: a resubmitted or requeued job resumes there), then stop; waits up to --wait\n"
       "  seconds (300) for that, else cancels without it (exit 1).\n",
       1, {{"--checkpoint", "", "checkpoint first"}, {"--wait", "S", "seconds to wait for the checkpoint (300)"}},
       RunCancel},
      {"plot", "", "plot JOB [--metric M] [--out FILE.svg|FILE.png] [--json]",
       "draw a metric's curve per rank (file, or braille on the terminal)",
       "  The job's metric over the steps, one line per rank, from the ranks' metrics files\n"
       "  (downsampled on the daemon: a band shows each bucket's min..max). Without --out it is\n"
       "  drawn on the terminal in braille characters; --json (or --output json) prints the\n"
       "  series (jobs.v1.Series as JSON).\n",
       1,
       {{"--metric", "M",
         "any numeric field of jobs.v1.StepMetrics (proto/jobs.proto): loss (default), "
         "tokens_per_s, step_s, comm_wait_s, grad_norm, lr, ...; aliases step_time, comm_wait, "
         "memory"},
        {"--json", "", "print the series as JSON (as --output json)"},
        {"--out", "FILE", "write FILE.svg or FILE.png instead"},
        {"--rank", "R", "only rank R"},
        {"--attempt", "N", "only attempt N (default: every attempt)"},
        {"--max-points", "N", "points per rank (default 2000 in a file, 2 per column on a terminal)"}},
       RunPlot},
      {"top", "", "top [JOB] [--once] [--interval-ms MS]",
       "live per-rank table: step, step time, comm wait, memory",
       "  Every rank's latest report (step, step time, share of it waiting in collectives,\n"
       "  tokens/s, loss, peak memory), redrawn in place; a rank whose own time (step time less\n"
       "  comm wait) is over 1.5x the median is marked straggler. Without JOB, every active job.\n"
       "  Ends with the job (or Ctrl-C); --once prints one table and exits.\n",
       0,
       {{"--once", "", "print once and exit (for scripts)"},
        {"--interval-ms", "MS", "refresh period (default 1000)"}},
       RunTop},
      {"nodes", "", "nodes", "daemons, devices (and which job holds each), telemetry",
       "  Registered daemons, their devices, which job holds each, memory and GPU telemetry.\n",
       0, {}, RunNodes},
      {"dump", "", "dump JOB", "ask every rank of a running job to dump its flight recorder",
       "  Every rank writes its flight recorder to the printed directory; then run\n"
       "  `emberctl fr analyze DIR`.\n",
       1, {}, RunDump},
      {"fr", "analyze", "fr analyze DIR [--json]", "explain a hang from flight-recorder dumps",
       "  Reads rank-*.json dumps and names the rank/op/sequence number behind a hang.\n"
       "  Exit 0 when nothing is wrong, 1 when a problem was found.\n",
       1, {{"--json", "", "JSON report (as --output json)"}}, RunFrAnalyze},
      {"ckpt", "inspect", "ckpt inspect PATH [--verify] [--json]",
       "summarise a checkpoint or safetensors file (exit 1: damaged)",
       "  PATH: a step directory, a checkpoint root (follows `latest`), a .safetensors file or a\n"
       "  model.safetensors.index.json. --verify exits 1 when any chunk is missing or corrupt.\n",
       1,
       {{"--verify", "", "checksum every chunk"},
        {"--json", "", "JSON summary (as --output json)"}},
       RunCkptInspect},
      {"ckpt", "export",
       "ckpt export CKPT OUT [--format safetensors|hf] [--dtype f32|bf16|f16] [--max-shard-bytes N] "
       "[--include-optimizer] [--spec JOB.yaml]",
       "unsharded weights as safetensors, or a Hugging Face Llama directory",
       "  safetensors (default): the full, unsharded tensors with Ember's parameter names; with\n"
       "  --max-shard-bytes OUT is a directory of model-0000k-of-0000n.safetensors and\n"
       "  model.safetensors.index.json (Hugging Face layout).\n"
       "  hf: OUT is a directory loadable by transformers' LlamaForCausalLM: config.json and\n"
       "  model.safetensors (or shards and the index) with Hugging Face names, q/k rows permuted to\n"
       "  its rotary convention, in --dtype (default f32). Llama checkpoints only (model.arch:\n"
       "  llama); the model comes from the checkpoint's record, or --spec for older checkpoints.\n"
       "  docs/formats.md has the mapping.\n",
       2,
       {{"--format", "F", "safetensors (default) or hf"},
        {"--dtype", "D", "hf: f32 (default), bf16 or f16"},
        {"--spec", "FILE", "hf: take the model config from this job spec"},
        {"--include-optimizer", "", "include the optim.* tensors (safetensors format)"},
        {"--max-shard-bytes", "N", "a sharded set of files of about N bytes each"}},
       RunCkptExport},
      {"pipeline", "show",
       "pipeline show [--schedule S] [--stages N] [--micro-batches M] [--ranks R] [--rendezvous]",
       "print a pipeline schedule's per-rank action table (no daemon needed)",
       "  The explicit action list each rank runs (F forward, B backward, I/W input/weight\n"
       "  gradient, sends and receives), built by the same function the workers use, then its\n"
       "  simulated makespan and bubble (F=1, B=2). Impossible layouts exit 2 naming the numbers.\n",
       0,
       {{"--schedule", "S", "gpipe, 1f1b, interleaved-1f1b or zbh1 (default 1f1b)"},
        {"--stages", "N", "pipeline stages (default 4)"},
        {"--micro-batches", "M", "micro-batches per step (default 8)"},
        {"--ranks", "R", "ranks (default: stages, or stages/2 for interleaved-1f1b)"},
        {"--rendezvous", "", "simulate sends that block until received"}},
       RunPipelineShow},
      {"weights", "subscribe", "weights subscribe JOB --out DIR --store HOST:PORT [--steps N]",
       "write a running job's live weights as safetensors (publish.every_steps)",
       "  Receives the weights the job's ranks publish every publish.every_steps steps over the\n"
       "  one-sided layer and writes DIR/step-N/model.safetensors for each step. Connects to the\n"
       "  cluster's store (--store or $EMBER_STORE) with the same token file as every command.\n"
       "  Ends after N snapshots (--steps) or when the job's ranks exit.\n",
       1,
       {{"--out", "DIR", "required: the snapshot directory"},
        {"--store", "HOST:PORT", "the cluster's store ($EMBER_STORE)"},
        {"--steps", "N", "stop after N snapshots (default: when the job ends)"}},
       RunWeightsSubscribe},
  };
  return *table;
}

}  // namespace ember::cli

int main(int argc, char** argv) {
  using ember::cli::kUsage;
  spdlog::set_level(getenv("EMBER_DEBUG") ? spdlog::level::info : spdlog::level::warn);
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa = {};
  sa.sa_handler = ember::cli::OnInterrupt;
  sigaction(SIGINT, &sa, nullptr);
  ember::cli::Args a;
  std::string err;
  if (!ember::cli::ParseArgs(argc, argv, &a, &err)) {
    std::cerr << "emberctl: " << err << "\n";
    return kUsage;
  }
  std::string out = a.Get("--output", "text");
  if (out != "text" && out != "json") {
    std::cerr << "emberctl: --output must be text or json\n";
    return kUsage;
  }
  ember::cli::Ctl ctl(std::move(a), argv[0]);
  return ctl.Run();
}
