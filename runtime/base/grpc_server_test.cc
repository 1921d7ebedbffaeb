// The gRPC accept path under a connection flood (issue 12): with gRPC's own listener, connections
// up to the descriptor limit made accept4 fail with EMFILE and the listener stopped for good while
// the process lived on. This binary lowers its own RLIMIT_NOFILE to 256 (for good: run it alone).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include <catch2/catch.hpp>

#include "absl/time/clock.h"
#include "proto/jobs.grpc.pb.h"
#include "runtime/base/grpc_server.h"

namespace ember::base {
namespace {

constexpr char kToken[] = "gate-test-token";

class Nodes final : public jobs::v1::Nodes::CallbackService {
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const jobs::v1::ListNodesRequest*,
                                 jobs::v1::ListNodesResponse* resp) override {
    resp->add_nodes()->set_name("n0");
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

// One call through a new connection (its own subchannel), as a fresh client would make it.
grpc::Status ListThroughNewConnection(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = jobs::v1::Nodes::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", std::string("Bearer ") + kToken);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  jobs::v1::ListNodesResponse resp;
  grpc::Status s = stub->List(&ctx, {}, &resp);
  if (s.ok() && resp.nodes_size() != 1) return grpc::Status(grpc::StatusCode::INTERNAL, "bad answer");
  return s;
}

// A child process (its own descriptors) opens `n` silent TCP connections, holds them until
// signalled, then exits.
pid_t Flood(int port, int n) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a test that died
  rlimit rl{4096, 4096};
  setrlimit(RLIMIT_NOFILE, &rl);  // (fails harmlessly if the hard limit is lower)
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) break;
    fds.push_back(fd);
  }
  pause();
  _exit(0);
}

TEST_CASE("a flood of silent connections past the descriptor limit leaves the listener serving") {
  rlimit small{256, 256};
  REQUIRE(setrlimit(RLIMIT_NOFILE, &small) == 0);
  Nodes service;
  GrpcServerOptions o;
  o.auth_token = kToken;
  auto server = StartGrpcServer(o, {&service});
  REQUIRE(server.ok());
  REQUIRE(ListThroughNewConnection(server->address).ok());

  pid_t attacker = Flood(server->port, 600);  // far more than 256 descriptors' worth
  absl::SleepFor(absl::Milliseconds(2000));    // accepted or refused, and past the 1 s grace
  grpc::Status during = ListThroughNewConnection(server->address);
  CHECK(during.error_message() == "");
  CHECK(during.ok());
  kill(attacker, SIGKILL);
  waitpid(attacker, nullptr, 0);
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(ListThroughNewConnection(server->address).ok());
}

}  // namespace
}  // namespace ember::base
