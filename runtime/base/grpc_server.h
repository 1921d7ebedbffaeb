// Starting gRPC servers the same way everywhere: bind (port 0 allowed), report the bound port.
//
//   ASSIGN_OR_RETURN(auto server, StartGrpcServer({.address = "127.0.0.1:0"}, {&service}));
//   int port = server.port;                    // the port the kernel gave us
//
// The returned server owns the listening socket; the services are borrowed and must outlive it.
#ifndef EMBER_RUNTIME_BASE_GRPC_SERVER_H_
#define EMBER_RUNTIME_BASE_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace ember::base {

struct GrpcServerOptions {
  std::string address = "127.0.0.1:0";  // host:port; port 0 picks a free port
  std::shared_ptr<grpc::ServerCredentials> credentials;  // null = insecure
  int max_message_bytes = 64 << 20;
};

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address;  // host:port actually bound
};

// Builds and starts a server with `services`. FailedPrecondition/Unavailable naming the address
// when the bind fails (address in use, bad host).
absl::StatusOr<StartedServer> StartGrpcServer(const GrpcServerOptions& options,
                                              const std::vector<grpc::Service*>& services);

// Maps between absl::Status and grpc::Status (codes are numerically identical).
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_GRPC_SERVER_H_
