// The CUDA IPC backend where it cannot work (no GPU or driver: this CI machine; or a build without
// CUDA): every entry point, and the Agent's kCuda paths, refuse with a clear status instead of
// crashing. On a machine with a GPU the refusal cases are skipped (with a warning) and a host pointer registered as
// kCuda must be refused instead (the GPU paths themselves: tests/gpu/onesided_cuda_ipc_check.cc).
#include "runtime/onesided/cuda_ipc.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "runtime/onesided/agent.h"
#include "runtime/onesided/agent_pair.h"
#include "runtime/onesided/descriptor.h"

namespace ember::onesided {
namespace {

// The code every refusal must carry here: FAILED_PRECONDITION with CUDA built in (no device or
// driver), UNIMPLEMENTED without.
absl::StatusCode Refusal() {
  const absl::Status a = cuda_ipc::Available();
  REQUIRE(!a.ok());
  REQUIRE((a.code() == absl::StatusCode::kFailedPrecondition || a.code() == absl::StatusCode::kUnimplemented));
  return a.code();
}

std::string FakeExport() {
  return std::string(cuda_ipc::kMagic) + std::string(64 + 8, '\x01');
}

TEST_CASE("cuda_ipc refuses cleanly without a GPU") {
  if (cuda_ipc::Available().ok()) {
    std::vector<char> host(64);
    const auto e = cuda_ipc::Export(host.data(), host.size());
    CHECK(e.status().code() == absl::StatusCode::kInvalidArgument);
    WARN("a CUDA device is present: the GPU check covers the working paths");
    return;
  }
  const absl::StatusCode code = Refusal();
  const absl::Status a = cuda_ipc::Available();
  INFO(a.ToString());
  CHECK(absl::StrContains(a.message(), "CUDA"));
  if (code == absl::StatusCode::kFailedPrecondition) CHECK(absl::StrContains(a.message(), "GPU"));

  std::vector<char> buf(4096);
  CHECK(cuda_ipc::Export(buf.data(), buf.size()).status().code() == code);
  CHECK(cuda_ipc::Mapping::Open(FakeExport(), 4096).status().code() == code);
  CHECK(cuda_ipc::IsExported(FakeExport()));
  CHECK_FALSE(cuda_ipc::IsExported("EOD1 a UCX key"));
  // Malformed exports are told apart from a missing GPU.
  CHECK(cuda_ipc::Mapping::Open("ECUDAIPC1 short", 4096).status().code() ==
        absl::StatusCode::kInvalidArgument);
  bool ran = false;
  auto copied = cuda_ipc::CopyAsync({{buf.data(), buf.data() + 1, 8}}, nullptr, [&] { ran = true; });
  CHECK(copied.status().code() == code);
  CHECK_FALSE(ran);
}

TEST_CASE("Agent refuses kCuda registration and GPU descriptors without a GPU") {
  if (cuda_ipc::Available().ok()) {
    WARN("a CUDA device is present: nothing to refuse");
    return;
  }
  const absl::StatusCode code = Refusal();
  auto pair = testing::AgentPair::Create();
  REQUIRE(pair.ok());
  Agent* a = (*pair)->a.get();
  Agent* b = (*pair)->b.get();
  Connection* cb = (*pair)->b_to_a;

  std::vector<char> buf(4096);
  auto reg = a->RegisterMemory(buf.data(), buf.size(), MemoryKind::kCuda);
  INFO(reg.status().ToString());
  CHECK(reg.status().code() == code);
  CHECK(absl::StrContains(reg.status().message(), "RegisterMemory(kCuda, 4096 bytes)"));
  // Host registration still works beside it.
  auto host = a->RegisterMemory(buf.data(), buf.size());
  REQUIRE(host.ok());

  // A peer's GPU descriptor (as a GPU machine would publish it) is refused on import.
  const std::string gpu_desc = PackDescriptor({"a", 0x7f0000000000, 4096, FakeExport()});
  auto imported = cb->ImportRegion(gpu_desc);
  INFO(imported.status().ToString());
  CHECK(imported.status().code() == code);
  CHECK(absl::StrContains(imported.status().message(), "a's GPU region of 4096 bytes"));
  // The host region still imports and transfers.
  auto remote = cb->ImportRegion(host->descriptor);
  REQUIRE(remote.ok());
  std::vector<char> mine(16, 'x');
  auto mreg = b->RegisterMemory(mine.data(), mine.size());
  REQUIRE(mreg.ok());
  CHECK(b->Put(cb, {{mreg->id, 0, 16}}, {{*remote, 100, 16}}).Wait(absl::Seconds(10)).ok());
  CHECK(b->Notify(cb, "after the put").Wait(absl::Seconds(10)).ok());
  auto note = a->WaitNotification(absl::Seconds(10));  // the put is visible once this arrives
  REQUIRE(note.ok());
  CHECK(note->message == "after the put");
  CHECK(std::string(buf.data() + 100, 16) == std::string(16, 'x'));
}

}  // namespace
}  // namespace ember::onesided
