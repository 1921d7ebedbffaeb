// ember-store: the rendezvous store as a standalone server.
//
//   ember-store --listen=127.0.0.1:29500 --auth-token-file=F [--data-dir=/var/lib/ember/store]
//               [--tls-cert=C --tls-key=K [--tls-ca=CA]]
//               [--backend=etcd --etcd-endpoints=a:2379,b:2379 [--etcd-prefix=/ember/] ...]
//               [--tcpstore-port=P --tcpstore-prefix=torch/ [--tcpstore-host=127.0.0.1]
//                [--tcpstore-max-buffered-bytes=N]]
//
// Authentication is on by default: without --auth-token-file it refuses to start (exit 2) unless
// given --insecure-no-auth (tests only), as emberd does. TLS: --tls-cert/--tls-key serve TLS (the
// plaintext fast path is then off); --tls-ca also requires client certificates (mTLS) unless
// --tls-verify-clients=false. Exit codes: 0 clean shutdown, 1 start-up failure, 2 bad flags.
// Prints "ember-store listening on HOST:PORT" once the port is bound (port 0 picks one), and with
// --port-file writes the port there (atomically) for scripts and tests.
//
// Under systemd (Type=notify) it sends READY=1 and then WATCHDOG=1 only after a real read through
// a fresh connection to each of its listeners (gRPC and fast path) succeeded: a process whose
// listener stopped accepting is not healthy, however alive it is.
#include <netdb.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "proto/store.grpc.pb.h"
#include "runtime/base/files.h"
#include "runtime/base/flags.h"
#include "runtime/base/grpc_server.h"
#include "runtime/base/auth.h"
#include "runtime/base/little_endian.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/reserved_keys.h"
#include "runtime/store/backend_flags.h"
#include "runtime/store/fast_path_protocol.h"
#include "runtime/store/server.h"
#include "runtime/store/tcpstore_server.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:29500", "host:port to bind (port 0 = any free port)");
ABSL_FLAG(std::string, data_dir, "", "directory for the write-ahead log; empty = in-memory only");
ABSL_FLAG(std::string, fsync, "never",
          "durable mode: 'never' (write() before ack; survives kill -9) or 'always' (fdatasync "
          "before ack, group-committed; survives power loss)");
ABSL_FLAG(std::string, auth_token_file, "", "file holding the token every client must present (required)");
ABSL_FLAG(bool, insecure_no_auth, false, "run WITHOUT authentication (testing only)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate: serve TLS (turns the plaintext fast path off)");
ABSL_FLAG(std::string, tls_key, "", "PEM key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA: require and verify client certificates (mTLS) unless --tls-verify-clients=false");
ABSL_FLAG(bool, tls_verify_clients, true, "with --tls-ca: require client certificates (mTLS)");
ABSL_FLAG(int64_t, max_key_bytes, 4096, "largest key accepted");
ABSL_FLAG(int64_t, max_value_bytes, 16 << 20, "largest value accepted");
ABSL_FLAG(int64_t, max_response_bytes, 64 << 20,
          "largest answer to one request (MultiGet, ListKeys): RESOURCE_EXHAUSTED above it");
ABSL_FLAG(int64_t, compact_after_bytes, 64 << 20, "snapshot and truncate the log past this size");
ABSL_FLAG(bool, repair, false,
          "if the write-ahead log is damaged in the middle (not just torn at the end by a crash), "
          "keep the records before the damage and drop the rest (a copy of the log is kept); "
          "without it the store refuses to start");
ABSL_FLAG(int, tcpstore_port, 0,
          "also serve PyTorch TCPStore clients (torch 1.13 protocol, NO authentication) on this "
          "port; 0 = off");
ABSL_FLAG(std::string, tcpstore_host, "127.0.0.1",
          "address for --tcpstore-port; anything but loopback lets every host reach its keys");
ABSL_FLAG(std::string, tcpstore_prefix, "",
          "required with --tcpstore-port: the key prefix its (unauthenticated) clients may touch, "
          "e.g. torch/; every key they name is stored under it, and emberd's records (jobs/, "
          "nodes/, ...) stay out of their reach");
ABSL_FLAG(int64_t, tcpstore_max_buffered_bytes, int64_t{256} << 20,
          "bytes the TCPStore listener buffers over all its connections (partial queries, unsent "
          "replies); above it large queries and answers wait their turn; 0 = no bound");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file once listening");

namespace {
volatile std::sig_atomic_t g_stop = 0;

// --tcpstore-prefix: TCPStore clients never authenticate, so the listener is scoped to a prefix
// that none of emberd's key spaces (reserved_keys.h) lies in or under; the store cannot
// tell whether an emberd uses it, so the prefix is required whenever the port is on.
absl::Status CheckTcpStorePrefix(const std::string& prefix) {
  std::string spaces;
  for (absl::string_view sp : ember::store::kReservedKeySpaces) absl::StrAppend(&spaces, spaces.empty() ? "" : ", ", sp);
  if (prefix.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tcpstore-port needs --tcpstore-prefix=PREFIX (e.g. --tcpstore-prefix=torch/): TCPStore "
        "clients never authenticate, so they may only touch the keys under a prefix that holds "
        "none of emberd's records (", spaces, "); without one, whoever reaches the port could read "
        "every job and forge jobs, files and fences (docs/operations.md)"));
  }
  for (absl::string_view sp : ember::store::kReservedKeySpaces) {
    if (absl::StartsWith(prefix, sp) || absl::StartsWith(sp, prefix)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tcpstore-prefix='", prefix, "' reaches emberd's key space ", sp, " (its records: ",
          spaces, "); name a prefix of its own, e.g. --tcpstore-prefix=torch/"));
    }
  }
  return absl::OkStatus();
}
void OnSignal(int) { g_stop = 1; }

// The probes below are deliberately minimal (no retries, no reconnects): one new connection, one
// read, a 5 s limit.
constexpr int kProbeTimeoutS = 5;

absl::Status ProbeGrpc(const std::string& target, const std::string& token,
                       std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a new connection, not a cached one
  auto stub = ember::store::v1::Store::NewStub(
      grpc::CreateCustomChannel(target, credentials, args));
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(kProbeTimeoutS));
  ember::store::v1::NumKeysRequest req;
  req.set_prefix("\x01ember-store-probe/");
  ember::store::v1::NumKeysResponse resp;
  return ember::base::FromGrpcStatus(stub->NumKeys(&ctx, req, &resp));
}

// Sends `batch` as one fast-path frame and reads one answer frame into *out.
bool FastRoundTrip(int fd, const ember::store::v1::RequestBatch& batch,
                   ember::store::v1::ResponseBatch* out) {
  std::string frame;
  ember::base::AppendU32LE(static_cast<uint32_t>(batch.ByteSizeLong()), &frame);
  batch.AppendToString(&frame);
  if (send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(frame.size())) {
    return false;
  }
  char hdr[4];
  if (recv(fd, hdr, 4, MSG_WAITALL) != 4) return false;
  uint32_t len = ember::base::LoadU32LE(hdr);
  if (len > (1u << 20)) return false;
  std::string payload(len, '\0');
  if (len > 0 && recv(fd, payload.data(), len, MSG_WAITALL) != static_cast<ssize_t>(len)) return false;
  return out->ParseFromString(payload) && out->responses_size() == 1;
}

absl::Status ProbeFastPath(const std::string& host, int port, const std::string& token) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) {
    return absl::UnavailableError(absl::StrCat("fast path: cannot resolve ", host));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{kProbeTimeoutS, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  bool connected = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  ember::store::v1::RequestBatch hello, read;
  hello.set_auth_token(token);
  auto* r = read.add_requests();
  r->set_id(1);
  r->mutable_num_keys()->set_prefix("\x01ember-store-probe/");
  ember::store::v1::ResponseBatch a, b;
  bool ok = connected && FastRoundTrip(fd, hello, &a) &&
            a.responses(0).message() == ember::store::kFastPathHello && FastRoundTrip(fd, read, &b) &&
            b.responses(0).code() == 0;
  if (fd >= 0) close(fd);
  if (!ok) {
    return absl::UnavailableError(absl::StrCat("fast path ", host, ":", port,
                                               ": no answer through a new connection"));
  }
  return absl::OkStatus();
}

// A client's view of health: a new connection through each listener, then a real read.
// Under TLS only gRPC listens, and the probe dials it with the store's own certificate, key and CA
// (a node certificate is valid for serverAuth and clientAuth and names the address; docs/operations.md).
absl::Status ProbeOwnApi(const ember::store::StoreServer& server, const std::string& token,
                         const std::shared_ptr<grpc::ChannelCredentials>& tls_credentials) {
  std::string bound = server.address();
  std::string host = bound.substr(0, bound.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  absl::Status s = ProbeGrpc(absl::StrCat(host, ":", server.port()), token, tls_credentials);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("gRPC: ", s.message()));
  if (server.fast_port() != 0) {
    std::string h = host.front() == '[' ? host.substr(1, host.size() - 2) : host;
    RETURN_IF_ERROR(ProbeFastPath(h, server.fast_port(), token));
  }
  return absl::OkStatus();
}
}  // namespace

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "ember-store");
  // Connection limits are sized from the descriptor limit (base::ConnectionShare).
  int64_t nofile = ember::base::RaiseOpenFileLimit();
  ember::store::StoreServerOptions opts;
  opts.address = absl::GetFlag(FLAGS_listen);
  opts.backend.data_dir = absl::GetFlag(FLAGS_data_dir);
  opts.backend.max_key_bytes = absl::GetFlag(FLAGS_max_key_bytes);
  opts.backend.max_value_bytes = absl::GetFlag(FLAGS_max_value_bytes);
  opts.backend.compact_after_bytes = absl::GetFlag(FLAGS_compact_after_bytes);
  opts.backend.max_response_bytes = absl::GetFlag(FLAGS_max_response_bytes);
  opts.backend.repair_wal = absl::GetFlag(FLAGS_repair);
  std::string fsync = absl::GetFlag(FLAGS_fsync);
  if (fsync == "always") {
    opts.backend.fsync = ember::store::FsyncPolicy::kAlways;
  } else if (fsync != "never") {
    spdlog::error("--fsync='{}' is not valid; use 'never' or 'always'", fsync);
    return 2;
  }
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    auto token = ember::base::ReadTokenFile(absl::GetFlag(FLAGS_auth_token_file));
    if (!token.ok()) {
      spdlog::error("--auth-token-file: {}", std::string(token.status().message()));
      return 2;
    }
    opts.auth_token = *token;
  } else if (!absl::GetFlag(FLAGS_insecure_no_auth)) {
    spdlog::error("--auth-token-file: required (authentication is on by default; "
                  "--insecure-no-auth turns it off for testing)");
    return 2;
  }
  ember::base::TlsOptions tls;
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  tls.verify_clients = absl::GetFlag(FLAGS_tls_verify_clients);
  if (tls.enabled()) {
    auto creds = ember::base::MakeServerCredentials(tls);
    if (!creds.ok()) {
      spdlog::error("TLS: {}", std::string(creds.status().message()));
      return 2;
    }
    opts.credentials = *creds;  // also turns the plaintext fast path off
  }
  auto backend = ember::store::ConfigureBackendFromFlags(&opts);  // --backend, --etcd-*
  if (!backend.ok()) {
    spdlog::error("{}", std::string(backend.status().message()));
    return 2;
  }
  auto server = ember::store::StoreServer::Start(opts);
  if (!server.ok()) {
    spdlog::error("ember-store failed to start: {}", server.status().ToString());
    return 1;
  }
  std::unique_ptr<ember::store::TcpStoreServer> tcpstore;
  if (const int p = absl::GetFlag(FLAGS_tcpstore_port); p > 0) {
    const int64_t budget = absl::GetFlag(FLAGS_tcpstore_max_buffered_bytes);
    if (budget < 0) {
      spdlog::error("ember-store: --tcpstore-max-buffered-bytes={} is negative; give a byte count "
                    "(0 = no bound)", budget);
      return 2;
    }
    const std::string prefix = absl::GetFlag(FLAGS_tcpstore_prefix);
    if (absl::Status s = CheckTcpStorePrefix(prefix); !s.ok()) {
      spdlog::error("ember-store: {}", std::string(s.message()));
      return 2;
    }
    auto t = ember::store::TcpStoreServer::Start(
        absl::GetFlag(FLAGS_tcpstore_host), p, (*server)->backend(),
        {.max_buffered_bytes = static_cast<size_t>(budget), .key_prefix = prefix});
    if (!t.ok()) {
      spdlog::error("ember-store: --tcpstore-port: {}", t.status().ToString());
      return 1;
    }
    tcpstore = std::move(*t);
    spdlog::warn("ember-store: serving TCPStore clients on {}:{} WITHOUT authentication, on the "
                 "keys under '{}' only", absl::GetFlag(FLAGS_tcpstore_host), p, prefix);
  }
  spdlog::info("ember-store listening on {} (backend: {}, auth: {}, tls: {}, open files: {})",
               (*server)->address(), *backend,
               opts.auth_token.empty() ? "OFF" : "token",
               tls.mutual() ? "mutual (client certificates required)"
                            : (tls.enabled() ? "on" : "off"),
               nofile);
  std::printf("ember-store listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  // Handlers first: whoever sees the port file may stop the store with SIGTERM at once.
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file); !port_file.empty()) {
    // Whole or absent: a reader polling for the file never sees a partial port number.
    absl::Status s =
        ember::base::WriteFileAtomic(port_file, absl::StrCat((*server)->port(), "\n"));
    if (!s.ok()) spdlog::warn("ember-store: cannot write --port-file: {}", s.ToString());
  }
  uint64_t watchdog_usec = 0;
  const bool watchdog = sd_watchdog_enabled(0, &watchdog_usec) > 0;
  const absl::Duration every =
      watchdog ? absl::Microseconds(watchdog_usec / 3) : absl::Seconds(10);
  std::shared_ptr<grpc::ChannelCredentials> probe_credentials;
  if (tls.enabled()) {
    ember::base::TlsOptions self = tls;
    if (!tls.mutual()) self.cert_file = self.key_file = "";  // no client certificate needed
    auto creds = ember::base::MakeChannelCredentials(self);
    if (!creds.ok()) {
      spdlog::error("TLS (health probe): {}", std::string(creds.status().message()));
      return 2;
    }
    probe_credentials = *creds;
  }
  bool ready = false, healthy = true;
  absl::Time next_probe = absl::Now();  // (the listeners (the ports) are bound: probe at once)
  while (!g_stop) {
    if (absl::Now() >= next_probe) {
      absl::Status s = ProbeOwnApi(**server, opts.auth_token, probe_credentials);
      if (s.ok()) {
        sd_notifyf(0, "%s%sSTATUS=serving on %s", ready ? "" : "READY=1\n",
                   watchdog ? "WATCHDOG=1\n" : "", server.value()->address().c_str());
        if (!healthy) spdlog::info("ember-store: serving again through its listeners");
        ready = healthy = true;
      } else {
        spdlog::error("ember-store: its own API does not answer through a new connection ({}); "
                      "not telling the watchdog it is alive", s.ToString());
        sd_notifyf(0, "STATUS=unhealthy: %s", std::string(s.message()).c_str());
        healthy = false;
      }
      next_probe = absl::Now() + every;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  spdlog::info("ember-store: shutting down");
  if (tcpstore != nullptr) tcpstore->Shutdown();
  (*server)->Shutdown();
  return 0;
}
