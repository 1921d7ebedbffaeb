#include "runtime/jobspec/parallel_dims.h"

#include "absl/strings/str_cat.h"
#include "runtime/jobspec/pipeline_layout.h"

namespace ember::spec {

absl::StatusOr<ParallelDims> ParallelDims::Create(int pp, int dp_replicate, int dp_shard,
                                                  int virtual_stages) {
  for (const auto& [name, v] : {std::pair<const char*, int>{"pp", pp},
                                {"dp_replicate", dp_replicate},
                                {"dp_shard", dp_shard},
                                {"virtual_stages", virtual_stages}}) {
    if (v < 1) return absl::InvalidArgumentError(absl::StrCat("ParallelDims: ", name, " is ", v, "; use 1 or more"));
  }
  const int64_t world = int64_t{pp} * dp_replicate * dp_shard;
  if (world > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("ParallelDims: pp x dp_replicate x dp_shard = ", world,
                                                   " ranks; at most ", 1 << 20));
  }
  return ParallelDims(pp, dp_replicate, dp_shard, virtual_stages);
}

absl::StatusOr<ParallelDims> ParallelDims::FromSpec(const v1::JobSpec& spec, int world) {
  const PipelineLayout pl = PipelineLayoutOf(spec);
  const int rep = std::max(1, spec.parallelism().dp_replicate());
  if (world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.world_size: ", world, " ranks; a job needs at least 1"));
  }
  if (world % pl.ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.pipeline_stages: ", pl.ranks, " stages on ", world, " ranks: the world must be "
        "pipeline_stages x dp_replicate x dp_shard; use a multiple of ", pl.ranks, " ranks"));
  }
  if (world % (pl.ranks * rep) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.dp_replicate: ", rep, " replicas x ", pl.ranks, " pipeline stages does not divide the ", world,
        " ranks (world = pipeline_stages x dp_replicate x dp_shard); use a dp_replicate that divides ",
        world / pl.ranks));
  }
  return Create(pl.ranks, rep, world / (pl.ranks * rep), pl.virtual_stages);
}

absl::StatusOr<ParallelDims> ParallelDims::FromResolved(const v1::JobSpec& spec) {
  const v1::Resolution& r = spec.resolved();
  if (r.version() == 0 || r.pp() < 1) {
    return absl::InvalidArgumentError("resolved: the spec carries no parallel dims (not resolved by spec::Resolve, "
                                      "or a script job)");
  }
  return Create(r.pp(), r.dp_replicate(), r.dp_shard(), r.virtual_stages());
}

int ParallelDims::GroupSize(Group g) const {
  switch (g) {
    case Group::kPipeline: return pp_;
    case Group::kDp: return dp();
    case Group::kShard: return dp_shard_;
    case Group::kReplicate: return dp_replicate_;
  }
  return 0;
}

ParallelDims::Split ParallelDims::SplitOf(Group g, int rank) const {
  const int p = PpRank(rank), d = DpIndex(rank), r = ReplicateIndex(rank), s = ShardIndex(rank);
  switch (g) {
    case Group::kPipeline: return {d, p, absl::StrCat("pipeline", d)};
    case Group::kDp: return {p, d, absl::StrCat("stage", p)};
    case Group::kShard: return {r * pp_ + p, s, absl::StrCat("shard", p, ".", r)};
    case Group::kReplicate: return {s * pp_ + p, r, absl::StrCat("replicate", p, ".", s)};
  }
  return {};
}

std::vector<int> ParallelDims::GroupRanks(Group g, int rank) const {
  const int p = PpRank(rank), d = DpIndex(rank), r = ReplicateIndex(rank), s = ShardIndex(rank);
  std::vector<int> out;
  out.reserve(GroupSize(g));
  switch (g) {
    case Group::kPipeline:
      for (int i = 0; i < pp_; ++i) out.push_back(RankAt(d, i));
      break;
    case Group::kDp:
      for (int i = 0; i < dp(); ++i) out.push_back(RankAt(i, p));
      break;
    case Group::kShard:
      for (int i = 0; i < dp_shard_; ++i) out.push_back(RankAt(r, i, p));
      break;
    case Group::kReplicate:
      for (int i = 0; i < dp_replicate_; ++i) out.push_back(RankAt(i, s, p));
      break;
  }
  return out;
}

std::vector<std::vector<int>> ParallelDims::AllGroups(Group g) const {
  std::vector<std::vector<int>> out(GroupCount(g));
  for (int rank = 0; rank < world(); ++rank) {
    const Split sp = SplitOf(g, rank);
    if (out[sp.color].empty()) out[sp.color] = GroupRanks(g, rank);
  }
  return out;
}

int64_t ParallelDims::SequencesPerReplica(const v1::JobSpec& spec) {
  const PipelineLayout pl = PipelineLayoutOf(spec);
  return int64_t{spec.batch_size()} * (pl.enabled() ? pl.micro_batches : 1) *
         std::max(1, spec.parallelism().micro_batches());
}

std::vector<int> ParallelDims::StagesOf(int pp_rank) const {
  std::vector<int> out;
  for (int v = 0; v < virtual_stages_; ++v) out.push_back(pp_rank + v * pp_);
  return out;
}

std::string ParallelDims::Layout() const {
  return absl::StrCat("pp=", pp_, ",dp_replicate=", dp_replicate_, ",dp_shard=", dp_shard_,
                      ",virtual_stages=", virtual_stages_, ",world=", world());
}

}  // namespace ember::spec
