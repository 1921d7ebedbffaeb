// launcher/slurm.h: the allocation read from Slurm's variables, the rank plan and its refusal, and
// the sbatch script, against values written out by hand.
#include "launcher/slurm.h"

#include <map>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"

namespace ember::slurm {
namespace {

std::function<std::string(const char*)> EnvOf(std::map<std::string, std::string> m) {
  return [m](const char* k) {
    auto it = m.find(k);
    return it == m.end() ? std::string() : it->second;
  };
}

absl::StatusOr<std::vector<std::string>> TwoNodes(const std::string& list) {
  REQUIRE(list == "ember-n[1-2]");
  return std::vector<std::string>{"ember-n1", "ember-n2"};
}

TEST_CASE("SLURM_JOB_CPUS_PER_NODE is expanded per node") {
  CHECK(*ParseCpusPerNode("4(x2),2") == std::vector<int>{4, 4, 2});
  CHECK(*ParseCpusPerNode("8") == std::vector<int>{8});
  CHECK(*ParseCpusPerNode("1,3(x1)") == std::vector<int>{1, 3});
  for (const char* bad : {"", "x", "4(x0)", "4(2)", "4(x2", "0"}) {
    INFO(bad);
    CHECK(!ParseCpusPerNode(bad).ok());
  }
}

TEST_CASE("GPUs per node from what Slurm set") {
  CHECK(GpusPerNode(EnvOf({})) == 0);
  CHECK(GpusPerNode(EnvOf({{"SLURM_GPUS_ON_NODE", "4"}})) == 4);
  CHECK(GpusPerNode(EnvOf({{"SLURM_GPUS_PER_NODE", "a100:2"}})) == 2);
  CHECK(GpusPerNode(EnvOf({{"SLURM_JOB_GPUS", "1,3"}, {"CUDA_VISIBLE_DEVICES", "0,1"}})) == 2);
  CHECK(GpusPerNode(EnvOf({{"CUDA_VISIBLE_DEVICES", "0,1"}})) == 0);  // not Slurm's
}

TEST_CASE("the allocation from the environment") {
  auto a = AllocationFromEnv(EnvOf({{"SLURM_JOB_ID", "17"},
                                    {"SLURM_JOB_NODELIST", "ember-n[1-2]"},
                                    {"SLURM_NNODES", "2"},
                                    {"SLURM_JOB_CPUS_PER_NODE", "2(x2)"}}),
                             TwoNodes);
  REQUIRE(a.ok());
  CHECK(a->job_id == "17");
  CHECK(a->nodes == std::vector<std::string>{"ember-n1", "ember-n2"});
  CHECK(a->cpus == std::vector<int>{2, 2});
  CHECK(a->gpus_per_node == 0);

  auto outside = AllocationFromEnv(EnvOf({}), TwoNodes);
  CHECK(outside.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(outside.status().message(), "SLURM_JOB_ID"));

  auto disagree = AllocationFromEnv(EnvOf({{"SLURM_JOB_ID", "17"},
                                           {"SLURM_JOB_NODELIST", "ember-n[1-2]"},
                                           {"SLURM_NNODES", "3"},
                                           {"SLURM_JOB_CPUS_PER_NODE", "2(x2)"}}),
                                    TwoNodes);
  CHECK(!disagree.ok());
  // SLURM_CPUS_ON_NODE alone (salloc with an older Slurm): taken as every node's.
  auto homog = AllocationFromEnv(EnvOf({{"SLURM_JOB_ID", "17"},
                                        {"SLURM_JOB_NODELIST", "ember-n[1-2]"},
                                        {"SLURM_NNODES", "2"},
                                        {"SLURM_CPUS_ON_NODE", "3"}}),
                                 TwoNodes);
  REQUIRE(homog.ok());
  CHECK(homog->cpus == std::vector<int>{3, 3});
}

TEST_CASE("ranks spread over the nodes, never more than a node holds") {
  SlurmAllocation a{"17", {"a", "b", "c"}, {4, 1, 4}, 2};
  CHECK(*PlanRanks(a, 4, false) == std::vector<int>{2, 1, 1});
  CHECK(*PlanRanks(a, 7, false) == std::vector<int>{3, 1, 3});
  CHECK(*PlanRanks(a, 9, false) == std::vector<int>{4, 1, 4});
  CHECK(*PlanRanks(a, 2, false) == std::vector<int>{1, 1, 0});
  CHECK(*PlanRanks(a, 5, true) == std::vector<int>{2, 2, 1});
}

TEST_CASE("a job larger than the allocation is refused naming both numbers") {
  SlurmAllocation a{"17", {"a", "b"}, {2, 2}, 0};
  auto cpu = PlanRanks(a, 5, false);
  REQUIRE(cpu.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(cpu.status().message(), "asks for 5 ranks"));
  CHECK(absl::StrContains(cpu.status().message(), "holds 4 CPUs"));
  auto gpu = PlanRanks(a, 1, true);
  REQUIRE(!gpu.ok());
  CHECK(absl::StrContains(gpu.status().message(), "holds 0 GPUs"));
  a.gpus_per_node = 4;
  auto gpu9 = PlanRanks(a, 9, true);
  REQUIRE(!gpu9.ok());
  CHECK(absl::StrContains(gpu9.status().message(), "asks for 9 ranks"));
  CHECK(absl::StrContains(gpu9.status().message(), "holds 8 GPUs (2 nodes x 4 GPUs)"));
}

TEST_CASE("the sbatch script") {
  SbatchOptions o;
  o.emberctl = "/opt/ember/emberctl";
  o.spec = "/home/u/it's.yaml";
  o.job_name = "tiny";
  o.nodes = 2;
  o.ranks_per_node = 4;
  o.gpus_per_node = 4;
  o.time = "1:00:00";
  o.partition = "gpu";
  o.output = "tiny-%j.out";
  o.warn_before_s = 120;
  CHECK(SbatchScript(o) ==
        "#!/bin/bash\n"
        "# Written by `emberctl slurm sbatch`: Ember on Slurm (docs/operations.md).\n"
        "#SBATCH --job-name=tiny\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=4\n"
        "#SBATCH --gpus-per-node=4\n"
        "#SBATCH --time=1:00:00\n"
        "#SBATCH --partition=gpu\n"
        "#SBATCH --output=tiny-%j.out\n"
        "#SBATCH --signal=B:USR1@120\n"
        "#SBATCH --requeue\n"
        "#SBATCH --open-mode=append\n"
        "exec '/opt/ember/emberctl' run --slurm '/home/u/it'\\''s.yaml'\n");
  SbatchOptions cpu;
  cpu.emberctl = "/e";
  cpu.spec = "/s.yaml";
  cpu.job_name = "c";
  cpu.work_root = "/shared/jobs";
  CHECK(SbatchScript(cpu) ==
        "#!/bin/bash\n"
        "# Written by `emberctl slurm sbatch`: Ember on Slurm (docs/operations.md).\n"
        "#SBATCH --job-name=c\n"
        "#SBATCH --nodes=1\n"
        "#SBATCH --ntasks-per-node=1\n"
        "exec '/e' run --slurm --work-root '/shared/jobs' '/s.yaml'\n");
}

}  // namespace
}  // namespace ember::slurm
