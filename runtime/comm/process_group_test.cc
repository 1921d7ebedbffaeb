// ProcessGroup argument checks that need no peers (a group of one, file rendezvous).
#include "runtime/comm/process_group.h"

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/comm/rendezvous.h"

namespace ember::comm {
namespace {

TEST_CASE("reducing collectives reject element types comm cannot reduce; others move any type") {
  char tmpl[] = "/tmp/pg_test_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  GroupOptions go;
  go.name = "solo";
  auto pg = ProcessGroup::Create(MakeFileRendezvous(tmpl), 0, 1, go);
  REQUIRE(pg.ok());
  std::vector<uint16_t> buf = {1, 2, 3}, out(3);
  absl::Status s = (*pg)->AllReduce(buf.data(), 3, DataType::kU16, ReduceOp::kSum)->Wait();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()) ==
        "all_reduce: cannot reduce dtype u16; use one of f32, bf16, f16, f64, i32, i64, u8");
  s = (*pg)->ReduceScatterSingle(buf.data(), out.data(), 3, DataType::kU16, ReduceOp::kSum)->Wait();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  // Byte-moving collectives and reducible types still work.
  REQUIRE((*pg)->AllGatherSingle(buf.data(), out.data(), 3, DataType::kU16)->Wait().ok());
  CHECK(out == buf);
  REQUIRE((*pg)->AllReduce(buf.data(), 3, DataType::kBF16, ReduceOp::kSum)->Wait().ok());
  pg->reset();
  std::filesystem::remove_all(tmpl);
}

TEST_CASE("device backends: no NCCL in this binary, unknown names, several devices") {
  char tmpl[] = "/tmp/pg_test_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  GroupOptions go;
  go.name = "dev";
  go.backend = "nccl";
  go.device = "cuda:0";
  // This test does not link //runtime/comm:nccl_driver, so there is no NCCL to use.
  auto pg = ProcessGroup::Create(MakeFileRendezvous(tmpl), 0, 1, go);
  CHECK(pg.status().code() == absl::StatusCode::kUnimplemented);
  CHECK(std::string(pg.status().message()).find("use backend cpu") != std::string::npos);
  go.backend = "nccl-legacy-2";
  pg = ProcessGroup::Create(MakeFileRendezvous(tmpl), 0, 1, go);
  CHECK(pg.status().code() == absl::StatusCode::kInvalidArgument);
  go.backend = "nccl-lazy";
  go.device = "cuda:0,cuda:1";
  pg = ProcessGroup::Create(MakeFileRendezvous(tmpl), 0, 1, go);
  CHECK(pg.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(pg.status().message()).find("nccl-legacy") != std::string::npos);
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace ember::comm
