// The NCCL driver's registration and start-up check, on any machine: with NCCL built in, a CUDA
// device that cannot be used (no driver, no GPU) fails group creation with FAILED_PRECONDITION
// naming the versions and the minimum; without NCCL, with UNIMPLEMENTED. On a machine with a
// usable GPU the check passes, and tests/gpu/run.sh covers it instead.
#include <stdlib.h>

#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "runtime/base/devices.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/rendezvous.h"

namespace ember::comm {
namespace {

TEST_CASE("nccl driver: registered, and refuses a device it cannot use with the versions") {
  char tmpl[] = "/tmp/nccl_driver_test_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  GroupOptions go;
  go.name = "g";
  go.backend = "nccl";
  go.device = "cpu";
  auto pg = ProcessGroup::Create(MakeFileRendezvous(tmpl), 0, 1, go);
#ifdef EMBER_WITH_NCCL
  CHECK(pg.status().code() == absl::StatusCode::kInvalidArgument);  // not cuda:N
  CHECK(std::string(pg.status().message()).find("cuda:N") != std::string::npos);
  if (base::CudaDeviceCount() == 0) {
    go.device = "cuda:0";
    pg = ProcessGroup::Create(MakeFileRendezvous(tmpl), 0, 1, go);
    INFO(pg.status().ToString());
    CHECK(pg.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(pg.status().message()).find("(the minimum)") != std::string::npos);
  }
#else
  CHECK(pg.status().code() == absl::StatusCode::kUnimplemented);
#endif
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace ember::comm
