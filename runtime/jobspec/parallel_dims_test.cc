// ParallelDims over every layout up to 64 ranks (every factorisation world = pp x dp_replicate x
// dp_shard, with 1 and 2 virtual stages), against a reference built independently: the ranks are
// handed out by nested loops in layout order (pp fastest, then shard, then replicate), and each
// group is found by comparing those coordinates, never by ParallelDims' divisions.
#include "runtime/jobspec/parallel_dims.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/jobspec/spec.h"

namespace ember::spec {
namespace {

using Group = ParallelDims::Group;

struct Coord {
  int pp, rep, shard;
};

// The reference layout: rank -> coordinates, in the order the ranks of a job are numbered.
std::vector<Coord> ReferenceLayout(int pp, int rep, int shard) {
  std::vector<Coord> out;
  for (int r = 0; r < rep; ++r)
    for (int s = 0; s < shard; ++s)
      for (int p = 0; p < pp; ++p) out.push_back({p, r, s});
  return out;
}

// The reference groups of kind g: ranks sharing the coordinates that g holds fixed, ordered by
// the coordinate that varies within it (world rank order, which the layout makes the same).
std::set<std::vector<int>> ReferenceGroups(const std::vector<Coord>& c, Group g) {
  std::map<std::tuple<int, int, int>, std::vector<int>> by;
  for (int rank = 0; rank < static_cast<int>(c.size()); ++rank) {
    const Coord& x = c[rank];
    std::tuple<int, int, int> k;
    switch (g) {
      case Group::kPipeline: k = {x.rep, x.shard, -1}; break;  // same replica: same dp index
      case Group::kDp: k = {x.pp, -1, -1}; break;
      case Group::kShard: k = {x.pp, x.rep, -1}; break;
      case Group::kReplicate: k = {x.pp, x.shard, -1}; break;
    }
    by[k].push_back(rank);  // ascending world rank
  }
  std::set<std::vector<int>> out;
  for (auto& [k, v] : by) out.insert(v);
  return out;
}

// What ProcessGroup::Split does with every rank's (color, key): groups by color, ordered by
// (key, rank).
std::map<int, std::vector<int>> SimulateSplit(const ParallelDims& d, Group g) {
  std::map<int, std::vector<std::pair<int, int>>> by_color;
  for (int rank = 0; rank < d.world(); ++rank) {
    const ParallelDims::Split s = d.SplitOf(g, rank);
    by_color[s.color].push_back({s.key, rank});
  }
  std::map<int, std::vector<int>> out;
  for (auto& [color, v] : by_color) {
    std::sort(v.begin(), v.end());
    for (auto& [key, rank] : v) out[color].push_back(rank);
  }
  return out;
}

TEST_CASE("parallel dims: every layout up to 64 ranks") {
  int layouts = 0;
  for (int world = 1; world <= 64; ++world) {
    for (int pp = 1; pp <= world; ++pp) {
      if (world % pp != 0) continue;
      for (int rep = 1; rep <= world / pp; ++rep) {
        if ((world / pp) % rep != 0) continue;
        const int shard = world / pp / rep;
        for (int v : {1, 2}) {
          ++layouts;
          auto dims = ParallelDims::Create(pp, rep, shard, v);
          REQUIRE(dims.ok());
          const ParallelDims& d = *dims;
          INFO(d.Layout());
          REQUIRE(d.world() == world);
          REQUIRE(d.dp() == rep * shard);
          const std::vector<Coord> ref = ReferenceLayout(pp, rep, shard);
          for (int rank = 0; rank < world; ++rank) {
            REQUIRE(d.PpRank(rank) == ref[rank].pp);
            REQUIRE(d.ReplicateIndex(rank) == ref[rank].rep);
            REQUIRE(d.ShardIndex(rank) == ref[rank].shard);
            REQUIRE(d.DpIndex(rank) == ref[rank].rep * shard + ref[rank].shard);
            REQUIRE(d.RankAt(d.DpIndex(rank), d.PpRank(rank)) == rank);
            REQUIRE(d.RankAt(ref[rank].rep, ref[rank].shard, ref[rank].pp) == rank);
          }
          for (Group g : ParallelDims::kAllGroups) {
            INFO("group kind " << static_cast<int>(g));
            const std::set<std::vector<int>> want = ReferenceGroups(ref, g);
            REQUIRE(static_cast<int>(want.size()) == d.GroupCount(g));
            // Every rank is in exactly one group of this kind, of the documented size.
            const std::vector<std::vector<int>> all = d.AllGroups(g);
            std::vector<int> seen(world, 0);
            for (const auto& grp : all) {
              REQUIRE(static_cast<int>(grp.size()) == d.GroupSize(g));
              for (int r : grp) ++seen[r];
            }
            REQUIRE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
            REQUIRE(std::set<std::vector<int>>(all.begin(), all.end()) == want);
            // Split colors/keys reproduce the rank lists; group i has color i.
            const std::map<int, std::vector<int>> split = SimulateSplit(d, g);
            REQUIRE(static_cast<int>(split.size()) == d.GroupCount(g));
            for (const auto& [color, ranks] : split) {
              REQUIRE(color >= 0);
              REQUIRE(color < d.GroupCount(g));
              REQUIRE(ranks == all[color]);
            }
            for (int rank = 0; rank < world; ++rank) {
              const std::vector<int> mine = d.GroupRanks(g, rank);
              const ParallelDims::Split s = d.SplitOf(g, rank);
              REQUIRE(want.count(mine) == 1);
              REQUIRE(mine == split.at(s.color));
              REQUIRE(mine[s.key] == rank);  // the key is the rank's place in the group
              for (int other : mine) REQUIRE(d.SplitOf(g, other).name == s.name);
            }
          }
          // Shard and replicate groups refine the dp group of a pp rank: their union is it.
          for (int rank = 0; rank < world; ++rank) {
            std::set<int> u;
            for (int r : d.GroupRanks(Group::kShard, rank))
              for (int x : d.GroupRanks(Group::kReplicate, r)) u.insert(x);
            const std::vector<int> dp = d.GroupRanks(Group::kDp, rank);
            REQUIRE(u == std::set<int>(dp.begin(), dp.end()));
          }
          // Data shards: a pipeline replica reads one shard; the replicas partition the batch.
          std::map<int, std::set<int>> ranks_of_shard;
          for (int rank = 0; rank < world; ++rank) {
            const ParallelDims::DataShard ds = d.DataShardOf(rank);
            REQUIRE(ds.world == rep * shard);
            REQUIRE(ds.rank >= 0);
            REQUIRE(ds.rank < ds.world);
            ranks_of_shard[ds.rank].insert(rank);
          }
          REQUIRE(static_cast<int>(ranks_of_shard.size()) == rep * shard);
          for (const auto& [s, ranks] : ranks_of_shard) {
            const std::vector<int> pipe = d.GroupRanks(Group::kPipeline, *ranks.begin());
            REQUIRE(ranks == std::set<int>(pipe.begin(), pipe.end()));
          }
          REQUIRE(d.TokensPerStep(3, 5) == int64_t{rep} * shard * 3 * 5);
          // Stages: s on pp rank s % pp (pipeline::Schedule::RankOfStage); each stage held once.
          REQUIRE(d.stages() == pp * v);
          std::vector<int> holder(d.stages(), -1);
          for (int p = 0; p < pp; ++p) {
            const std::vector<int> st = d.StagesOf(p);
            REQUIRE(static_cast<int>(st.size()) == v);
            REQUIRE(std::is_sorted(st.begin(), st.end()));
            for (int s : st) {
              REQUIRE(holder[s] == -1);
              holder[s] = p;
            }
          }
          for (int s = 0; s < d.stages(); ++s) {
            REQUIRE(holder[s] == s % pp);
            REQUIRE(d.PpRankOfStage(s) == s % pp);
          }
          REQUIRE(d.Layout() == absl::StrCat("pp=", pp, ",dp_replicate=", rep, ",dp_shard=", shard,
                                             ",virtual_stages=", v, ",world=", world));
        }
      }
    }
  }
  CHECK(layouts == 2 * 796);  // sum over world <= 64 of the ordered 3-factorisations, x 2
}

TEST_CASE("parallel dims: the layout the trainer has always used") {
  // pp=2 on 8 ranks: replica d holds world ranks 2d, 2d + 1 (trainer.cc's CreateGroups and
  // LoaderFor before ParallelDims).
  auto d = ParallelDims::Create(2, 1, 4);
  REQUIRE(d.ok());
  CHECK(d->GroupRanks(Group::kPipeline, 5) == std::vector<int>{4, 5});
  CHECK(d->GroupRanks(Group::kDp, 5) == std::vector<int>{1, 3, 5, 7});
  CHECK(d->SplitOf(Group::kPipeline, 5).name == "pipeline2");
  CHECK(d->SplitOf(Group::kDp, 5).name == "stage1");
  CHECK(d->DataShardOf(5).rank == 2);
  CHECK(d->DataShardOf(5).world == 4);
  // HSDP 2 x 2 without a pipeline: shard groups {0,1}, {2,3}; replicate groups {0,2}, {1,3}.
  auto h = ParallelDims::Create(1, 2, 2);
  REQUIRE(h.ok());
  CHECK(h->GroupRanks(Group::kShard, 3) == std::vector<int>{2, 3});
  CHECK(h->GroupRanks(Group::kReplicate, 3) == std::vector<int>{1, 3});
  CHECK(h->Layout() == "pp=1,dp_replicate=2,dp_shard=2,virtual_stages=1,world=4");
}

TEST_CASE("parallel dims: from a spec, naming the field") {
  auto spec = [](const std::string& par) {
    auto s = ParseJobSpec(absl::StrCat("model: {n_layers: 4, n_heads: 2, d_model: 32}\n"
                                       "data: {text_path: c.txt}\nparallelism: ", par, "\n"));
    REQUIRE(s.ok());
    return *s;
  };
  auto d = ParallelDims::FromSpec(spec("{strategy: pipeline, pipeline_stages: 2}"), 8);
  REQUIRE(d.ok());
  CHECK(d->Layout() == "pp=2,dp_replicate=1,dp_shard=4,virtual_stages=1,world=8");
  d = ParallelDims::FromSpec(spec("{strategy: pipeline, pipeline_stages: 2, pipeline_schedule: "
                                  "interleaved_1f1b, pipeline_micro_batches: 4}"), 2);
  REQUIRE(d.ok());
  CHECK(d->StagesOf(1) == std::vector<int>{1, 3});
  d = ParallelDims::FromSpec(spec("{dp_replicate: 2}"), 8);
  REQUIRE(d.ok());
  CHECK(d->Layout() == "pp=1,dp_replicate=2,dp_shard=4,virtual_stages=1,world=8");
  d = ParallelDims::FromSpec(spec("{dp_replicate: 0}"), 3);
  REQUIRE(d.ok());
  CHECK(d->Layout() == "pp=1,dp_replicate=1,dp_shard=3,virtual_stages=1,world=3");
  CHECK(absl::StartsWith(ParallelDims::FromSpec(spec("{strategy: pipeline, pipeline_stages: 2}"), 3)
                             .status().message(), "parallelism.pipeline_stages: "));
  CHECK(absl::StartsWith(ParallelDims::FromSpec(spec("{dp_replicate: 3}"), 8).status().message(),
                         "parallelism.dp_replicate: "));
  CHECK(absl::StartsWith(ParallelDims::FromSpec(spec("{}"), 0).status().message(),
                         "parallelism.world_size: "));
  CHECK(!ParallelDims::Create(0, 1, 1).ok());
  CHECK(!ParallelDims::Create(1, 1, 1, 0).ok());
  // Sequences per replica: batch_size x pipeline micro-batches x gradient accumulation.
  CHECK(ParallelDims::SequencesPerReplica(spec("{strategy: pipeline, pipeline_stages: 2, "
                                               "pipeline_micro_batches: 3}")) == 4 * 3);
  CHECK(ParallelDims::SequencesPerReplica(spec("{micro_batches: 5}")) == 4 * 5);
}

}  // namespace
}  // namespace ember::spec
