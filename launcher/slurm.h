// Ember inside a Slurm allocation: what `emberctl run --slurm` and `emberctl slurm sbatch` compute
// before anything starts (docs/operations.md "Running on Slurm"). Pure functions over the
// allocation's environment, except ExpandHostnames and NodeAddress, which run scontrol.
//
//   ASSIGN_OR_RETURN(SlurmAllocation a, AllocationFromEnv(GetEnv, ExpandHostnames));
//   ASSIGN_OR_RETURN(std::vector<int> per_node, PlanRanks(a, world_size, /*cuda=*/false));
//   std::string script = SbatchScript(opts);   // what `emberctl slurm sbatch` submits
//
// Thread-safe (no state).
#ifndef EMBER_LAUNCHER_SLURM_H_
#define EMBER_LAUNCHER_SLURM_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::slurm {

// The allocation `run --slurm` runs in, from the variables Slurm sets in a batch script or salloc
// shell.
struct SlurmAllocation {
  std::string job_id;              // SLURM_JOB_ID
  std::vector<std::string> nodes;  // SLURM_JOB_NODELIST expanded, in Slurm's order
  std::vector<int> cpus;           // CPUs per node (SLURM_JOB_CPUS_PER_NODE), nodes.size() entries
  int gpus_per_node = 0;           // GPUs Slurm gave each node (0 = none)
};

// "4(x2),2" (SLURM_JOB_CPUS_PER_NODE) -> {4, 4, 2}. INVALID_ARGUMENT naming the text otherwise.
absl::StatusOr<std::vector<int>> ParseCpusPerNode(const std::string& s);

// GPUs per node from SLURM_GPUS_ON_NODE, else SLURM_GPUS_PER_NODE ("a100:2" or "2"), else the
// entries of CUDA_VISIBLE_DEVICES when SLURM_JOB_GPUS is set; 0 when Slurm gave none.
int GpusPerNode(const std::function<std::string(const char*)>& env);

// Reads the allocation. `env` returns "" for an unset variable; `hostnames` expands a Slurm node
// list (ExpandHostnames). FAILED_PRECONDITION naming SLURM_JOB_ID outside an allocation;
// INVALID_ARGUMENT when SLURM_NNODES, the node list and the CPU counts disagree.
absl::StatusOr<SlurmAllocation> AllocationFromEnv(
    const std::function<std::string(const char*)>& env,
    const std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>& hostnames);

// Ranks per node for a job of `world_size` ranks: spread round-robin over the nodes (every node
// gets one before any gets two), each node at most its CPUs (cpu jobs) or gpus_per_node (cuda
// jobs). INVALID_ARGUMENT naming both numbers (the ranks asked for and what the allocation holds)
// when the job asks for more; for cuda jobs also when the allocation has no GPUs.
absl::StatusOr<std::vector<int>> PlanRanks(const SlurmAllocation& a, int world_size, bool cuda);

// `scontrol show hostnames LIST`, one name per line. UNAVAILABLE naming scontrol when it fails.
absl::StatusOr<std::vector<std::string>> ExpandHostnames(const std::string& nodelist);

// The address Slurm reaches `node` at (NodeAddr of `scontrol show node NODE -o`).
absl::StatusOr<std::string> NodeAddress(const std::string& node);

// "" when `node` is up, else "node N is DOWN (Reason=...)" from `scontrol show node N -o`
// (states DOWN, DRAIN, FAIL, NOT_RESPONDING): why Slurm stopped a job, for its output; "node N:
// state unknown (...)" when scontrol fails.
std::string NodeTrouble(const std::string& node);

// `emberctl slurm sbatch`: the batch script for a spec.
struct SbatchOptions {
  std::string emberctl;       // absolute path of emberctl on the nodes
  std::string spec;           // absolute path of the job spec (or script)
  std::string job_name;       // --job-name
  int nodes = 1;              // --nodes
  int ranks_per_node = 1;     // --ntasks-per-node (cpu jobs: also the CPUs per node)
  int gpus_per_node = 0;      // --gpus-per-node (0 = a cpu job)
  std::string time;           // --time ("" = the partition's default)
  std::string partition;      // --partition ("" = the default partition)
  std::string output;         // --output ("" = Slurm's slurm-%j.out)
  std::string work_root;      // run --slurm --work-root ("" = its default)
  // With a time limit: --signal=B:USR1@warn_before_s (emberctl stops the job at its checkpoint
  // and requeues it), --requeue, and --open-mode=append (the requeued run's output follows).
  // 0 = none of these.
  int warn_before_s = 0;
};
std::string SbatchScript(const SbatchOptions& o);

}  // namespace ember::slurm

#endif  // EMBER_LAUNCHER_SLURM_H_
