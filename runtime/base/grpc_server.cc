#include "runtime/base/grpc_server.h"

#include "absl/strings/str_cat.h"

namespace ember::base {

absl::StatusOr<StartedServer> StartGrpcServer(const GrpcServerOptions& options,
                                              const std::vector<grpc::Service*>& services) {
  grpc::ServerBuilder builder;
  int port = 0;
  auto creds = options.credentials ? options.credentials : grpc::InsecureServerCredentials();
  builder.AddListeningPort(options.address, creds, &port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Two servers must never share a port silently (gRPC enables SO_REUSEPORT by default).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Half-open or idle connections must not pin resources forever.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  for (grpc::Service* s : services) builder.RegisterService(s);
  StartedServer out;
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "could not bind gRPC server to '", options.address,
        "'; is the port in use or the host not local? Pick another --listen address"));
  }
  out.port = port;
  std::string host = options.address.substr(0, options.address.rfind(':'));
  out.address = absl::StrCat(host, ":", port);
  return out;
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace ember::base
