// ParallelDims: the one home of Ember's rank arithmetic (issue 32 item 5). A job of `world` ranks
// is pp x dp_replicate x dp_shard: `pp` pipeline ranks per pipeline replica, and dp = dp_replicate
// x dp_shard data-parallel replicas of the pipeline, where HSDP shards parameters within a group
// of dp_shard ranks and all-reduces gradients across the dp_replicate groups. Plain FSDP is
// pp = 1, dp_replicate = 1; a pipeline job with FSDP-sharded stages is pp > 1, dp_replicate = 1.
//
// Rank layout (unchanged from the pipeline's first layout, so checkpoints and tests stay valid):
// a pipeline replica's ranks are contiguous,
//
//   world rank = dp_index * pp + pp_rank,     dp_index = replicate_index * dp_shard + shard_index
//
// Every question about "which ranks / which data shard / which stage" is answered here: the
// worker's groups (pipeline group of a replica, the dp group of a pp rank = all its replicas, the
// shard group and the replicate group within it) as ProcessGroup::Split (color, key) pairs and as
// explicit rank lists, the loader's shard, tokens per step, the stages a pp rank holds (stage s on
// pp rank s % pp, as pipeline::Schedule::RankOfStage), and a layout string for logs and
// checkpoint metadata.
//
//   ASSIGN_OR_RETURN(ParallelDims dims, ParallelDims::FromSpec(spec, world));
//   const ParallelDims::Split s = dims.SplitOf(ParallelDims::Group::kPipeline, rank);
//   ASSIGN_OR_RETURN(auto pipe, world_group->Split(s.color, s.key, s.name));
//
// A value type; pure functions (no comm, no I/O). Thread-safe.
#ifndef EMBER_RUNTIME_JOBSPEC_PARALLEL_DIMS_H_
#define EMBER_RUNTIME_JOBSPEC_PARALLEL_DIMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job_spec.pb.h"

namespace ember::spec {

class ParallelDims {
 public:
  // The groups a rank belongs to. Each kind partitions the world: every rank is in exactly one
  // group of each kind.
  enum class Group {
    kPipeline,   // the pp ranks of one pipeline replica (dp_index fixed), ordered by pp rank
    kDp,         // the dp ranks holding the same pp rank (all its replicas), ordered by dp index
    kShard,      // within kDp: the dp_shard ranks of one replicate group, ordered by shard index
    kReplicate,  // within kDp: the dp_replicate ranks with the same shard index, by replicate index
  };
  static constexpr Group kAllGroups[] = {Group::kPipeline, Group::kDp, Group::kShard,
                                         Group::kReplicate};

  // Arguments of ProcessGroup::Split for one rank: ranks with the same color form the group,
  // ordered by key; `name` is the same on every member ("pipeline<d>", "stage<p>",
  // "shard<p>.<r>", "replicate<p>.<s>"; "stage<p>" is the dp group's name since the first
  // pipeline layout, kept for flight-recorder dumps).
  struct Split {
    int color = 0;
    int key = 0;
    std::string name;
  };

  // The loader's view: this rank reads shard `rank` of `world` (its dp index of dp size); the
  // ranks of one pipeline replica read the same shard.
  struct DataShard {
    int rank = 0;
    int world = 1;
  };

  // INVALID_ARGUMENT naming the argument when a count is < 1 (pp, dp_replicate, dp_shard,
  // virtual_stages) or the world would exceed 1 << 20 ranks.
  static absl::StatusOr<ParallelDims> Create(int pp, int dp_replicate, int dp_shard,
                                             int virtual_stages = 1);

  // The dims of a (defaulted) spec on `world` ranks: pp = parallelism.pipeline_stages (0/1 = 1),
  // virtual stages as PipelineLayoutOf, dp_replicate = parallelism.dp_replicate (0/1 = 1),
  // dp_shard = world / (pp * dp_replicate). INVALID_ARGUMENT naming the field when world is not
  // a multiple of pipeline_stages ("parallelism.pipeline_stages") or of pipeline_stages x
  // dp_replicate ("parallelism.dp_replicate"), or world < 1 ("parallelism.world_size").
  static absl::StatusOr<ParallelDims> FromSpec(const ::ember::spec::v1::JobSpec& spec, int world);

  // The dims a resolved spec carries (resolved.pp, dp_replicate, dp_shard, virtual_stages; set by
  // spec::Resolve, resolve.h): what a worker builds its groups and loader from.
  // INVALID_ARGUMENT "resolved: ..." for a spec without them (not resolved, or a script job).
  static absl::StatusOr<ParallelDims> FromResolved(const ::ember::spec::v1::JobSpec& resolved);

  int pp() const { return pp_; }
  int dp_replicate() const { return dp_replicate_; }
  int dp_shard() const { return dp_shard_; }
  int virtual_stages() const { return virtual_stages_; }
  int dp() const { return dp_replicate_ * dp_shard_; }
  int world() const { return pp_ * dp(); }
  int stages() const { return pp_ * virtual_stages_; }  // model stages (block groups)
  bool pipeline() const { return pp_ > 1; }
  bool hsdp() const { return dp_replicate_ > 1; }

  // Coordinates of a world rank (REQUIRES: 0 <= rank < world()).
  int PpRank(int rank) const { return rank % pp_; }
  int DpIndex(int rank) const { return rank / pp_; }
  int ReplicateIndex(int rank) const { return DpIndex(rank) / dp_shard_; }
  int ShardIndex(int rank) const { return DpIndex(rank) % dp_shard_; }
  // The inverse: the world rank at (dp_index, pp_rank) and at (replicate, shard, pp_rank).
  int RankAt(int dp_index, int pp_rank) const { return dp_index * pp_ + pp_rank; }
  int RankAt(int replicate, int shard, int pp_rank) const {
    return RankAt(replicate * dp_shard_ + shard, pp_rank);
  }

  // Group sizes and counts (size x count = world for every kind).
  int GroupSize(Group g) const;
  int GroupCount(Group g) const { return world() / GroupSize(g); }
  // The group of kind `g` that `rank` is in: its world ranks in group-rank order, the Split that
  // forms it, and `rank`'s position in it (== its Split key).
  std::vector<int> GroupRanks(Group g, int rank) const;
  Split SplitOf(Group g, int rank) const;
  // Every group of kind `g`, each in group-rank order; group i has Split color i.
  std::vector<std::vector<int>> AllGroups(Group g) const;

  // The loader's shard of `rank`: {DpIndex(rank), dp()}.
  DataShard DataShardOf(int rank) const { return {DpIndex(rank), dp()}; }

  // Tokens one optimizer step trains on, over the whole job: every dp replica reads
  // sequences_per_replica sequences of seq_len tokens. SequencesPerReplica(spec) is batch_size x
  // pipeline micro-batches (1 without a pipeline) x parallelism.micro_batches (gradient
  // accumulation).
  int64_t TokensPerStep(int64_t sequences_per_replica, int64_t seq_len) const {
    return static_cast<int64_t>(dp()) * sequences_per_replica * seq_len;
  }
  static int64_t SequencesPerReplica(const ::ember::spec::v1::JobSpec& spec);

  // Pipeline stages: stage s runs on pp rank s % pp (pipeline::Schedule::RankOfStage); pp rank
  // r holds stages r, r + pp, ..., r + (virtual_stages - 1) * pp, in that order.
  int PpRankOfStage(int stage) const { return stage % pp_; }
  std::vector<int> StagesOf(int pp_rank) const;

  // "pp=2,dp_replicate=1,dp_shard=2,virtual_stages=1,world=4": in logs and checkpoint metadata.
  std::string Layout() const;

  friend bool operator==(const ParallelDims& a, const ParallelDims& b) {
    return a.pp_ == b.pp_ && a.dp_replicate_ == b.dp_replicate_ && a.dp_shard_ == b.dp_shard_ &&
           a.virtual_stages_ == b.virtual_stages_;
  }

 private:
  ParallelDims(int pp, int dp_replicate, int dp_shard, int virtual_stages)
      : pp_(pp), dp_replicate_(dp_replicate), dp_shard_(dp_shard),
        virtual_stages_(virtual_stages) {}
  int pp_, dp_replicate_, dp_shard_, virtual_stages_;
};

}  // namespace ember::spec

#endif  // EMBER_RUNTIME_JOBSPEC_PARALLEL_DIMS_H_
