// CPU tests of the CUDA kernels' host-side plans (plan.h): launch shapes, reduction splits,
// multi-tensor batches and the LCE chunking. These run everywhere (no GPU needed).
#include "kernels/cuda/plan.h"

#include <map>
#include <set>

#include <catch2/catch.hpp>

namespace ember::kernels::cuda {
namespace {

TEST_CASE("ElementwiseLaunch covers n and caps the grid") {
  CHECK(ElementwiseLaunch(0).grid == 0);
  Launch l = ElementwiseLaunch(1000);
  CHECK(l.block == 256);
  CHECK(l.grid == 4);
  CHECK(ElementwiseLaunch(1025, 4).grid == 2);  // 257 vectors
  CHECK(ElementwiseLaunch(int64_t{1} << 40).grid == kMaxGrid);
}

TEST_CASE("RowLaunch sizes the block to the row, in whole warps, at most 1024") {
  CHECK(RowLaunch(0, 10, 4).grid == 0);
  Launch l = RowLaunch(8, 128256, 4);  // 32064 float4 -> 4008 threads wanted -> capped at 1024
  CHECK(l.grid == 8);
  CHECK(l.block == 1024);
  CHECK(RowLaunch(3, 768, 4).block == 32);       // 192 vectors / 8 = 24 -> one warp
  CHECK(RowLaunch(3, 4096, 4).block == 128);     // 1024 vectors / 8
  CHECK(RowLaunch(3, 4100, 4).block == 160);     // 1025 vectors -> 129 threads -> 5 warps
  CHECK(RowLaunch(1, 7, 1, 8).block == 32);
}

TEST_CASE("PlanColumnReduce partitions rows by N only and covers them exactly") {
  for (int64_t N : {1, 5, 64, 65, 1000, 8192}) {
    ColumnReducePlan p = PlanColumnReduce(N, 768);
    CHECK(p.segments * p.rows_per_segment >= N);
    CHECK((p.segments - 1) * p.rows_per_segment < N);
    ColumnReducePlan q = PlanColumnReduce(N, 4096);  // independent of C
    CHECK(q.segments == p.segments);
  }
  CHECK(PlanColumnReduce(0, 10).segments == 0);
  ColumnReducePlan huge = PlanColumnReduce(int64_t{10} << 20, 8);  // 10M rows
  CHECK(huge.segments <= 65535);
  CHECK(huge.segments * huge.rows_per_segment >= (int64_t{10} << 20));
}

TEST_CASE("PlanMultiTensor: every chunk once, in order, within the batch limits") {
  const int64_t chunk = 100;
  std::vector<int64_t> sizes;
  for (int i = 0; i < 60; ++i) sizes.push_back((i * 37) % 1500 + (i % 7 == 0 ? 0 : 1));
  sizes.push_back(100 * 700 + 1);  // one tensor larger than a batch's chunk limit
  std::vector<MultiTensorBatch> batches = PlanMultiTensor(sizes, chunk);
  std::map<int, std::set<int64_t>> seen;
  int64_t global = 0;
  for (const MultiTensorBatch& b : batches) {
    CHECK(b.first_chunk == global);
    CHECK(!b.chunks.empty());
    CHECK(static_cast<int>(b.chunks.size()) <= kMaxChunksPerBatch);
    CHECK(static_cast<int>(b.tensors.size()) <= kMaxTensorsPerBatch);
    for (size_t i = 1; i < b.tensors.size(); ++i) CHECK(b.tensors[i] > b.tensors[i - 1]);
    for (auto [pos, c] : b.chunks) {
      REQUIRE(pos < static_cast<int>(b.tensors.size()));
      const int t = b.tensors[pos];
      CHECK(c * chunk < sizes[t]);
      CHECK(seen[t].insert(c).second);  // never twice
      ++global;
    }
  }
  CHECK(global == NumChunks(sizes, chunk));
  for (int t = 0; t < static_cast<int>(sizes.size()); ++t)
    CHECK(static_cast<int64_t>(seen[t].size()) == (sizes[t] + chunk - 1) / chunk);
  CHECK(PlanMultiTensor({}, chunk).empty());
  CHECK(PlanMultiTensor({0, 0}, chunk).empty());
}

TEST_CASE("PlanLce keeps the workspace within budget and independent of N") {
  // V = 128,256, N = 8,192 (the shape): logits would be 4 GiB in fp32.
  LcePlan p = PlanLce(8192, 128256);
  CHECK(p.vocab_chunk == 8192);
  CHECK(p.token_chunk % 64 == 0);
  CHECK(p.workspace_bytes <= (int64_t{64} << 20));
  CHECK(p.num_token_chunks * p.token_chunk >= 8192);
  CHECK(p.num_vocab_chunks * p.vocab_chunk >= 128256);
  CHECK(p.tile_bytes == p.token_chunk * p.vocab_chunk * 4);
  LcePlan big = PlanLce(8192 * 16, 128256);
  CHECK(big.workspace_bytes == p.workspace_bytes);  // more tokens: more chunks, same memory
  CHECK(big.num_token_chunks > p.num_token_chunks);

  LcePlan small = PlanLce(10, 50);  // tiny problem: one tile, token chunk rounded to 64
  CHECK(small.vocab_chunk == 50);
  CHECK(small.token_chunk == 64);
  CHECK(small.num_token_chunks == 1);
  CHECK(small.num_vocab_chunks == 1);

  LcePlan fixed = PlanLce(1000, 5000, 128, 1024);  // explicit chunks are kept
  CHECK(fixed.token_chunk == 128);
  CHECK(fixed.vocab_chunk == 1024);
  CHECK(fixed.num_token_chunks == 8);
  CHECK(fixed.num_vocab_chunks == 5);

  LcePlan tight = PlanLce(8192, 128256, 0, 0, int64_t{8} << 20);  // 8 MiB budget
  CHECK(tight.workspace_bytes <= (int64_t{8} << 20));
  CHECK(tight.token_chunk == 192);
}

}  // namespace
}  // namespace ember::kernels::cuda
