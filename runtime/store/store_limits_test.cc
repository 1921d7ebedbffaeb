// Hostile clients on loopback (issue 12): connection floods, oversized frames before the handshake,
// answers too large to send, clients that stop reading. Each case failed before the limits existed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <fstream>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "proto/store.grpc.pb.h"
#include "runtime/base/little_endian.h"
#include "runtime/store/client.h"
#include "runtime/store/store_process_test_util.h"
#include "runtime/store/fast_path_protocol.h"
#include "runtime/store/server.h"

namespace ember::store {
namespace {

using testing::StoreBinary;
using testing::WaitPort;

constexpr char kToken[] = "limits-test-token";

// A TCP connection to 127.0.0.1:port that says nothing (the attacker's cheapest move); -1 when
// connect fails.
int TryRawConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int RawConnect(int port) {
  int fd = TryRawConnect(port);
  REQUIRE(fd >= 0);
  return fd;
}

// Whether the server closed `fd` (EOF or reset) within `timeout`. Discards anything it sent.
bool ClosedByServer(int fd, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t k = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

// Sends the fast-path handshake; true if the server accepted the token.
bool FastHandshake(int fd, const std::string& token) {
  v1::RequestBatch hello;
  hello.set_auth_token(token);
  std::string payload = hello.SerializeAsString(), frame;
  base::AppendU32LE(static_cast<uint32_t>(payload.size()), &frame);
  frame += payload;
  if (send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(frame.size())) {
    return false;
  }
  char hdr[4];
  if (recv(fd, hdr, 4, MSG_WAITALL) != 4) return false;
  std::string reply(base::LoadU32LE(hdr), '\0');
  if (recv(fd, reply.data(), reply.size(), MSG_WAITALL) != static_cast<ssize_t>(reply.size())) {
    return false;
  }
  v1::ResponseBatch rb;
  return rb.ParseFromString(reply) && rb.responses_size() == 1 &&
         rb.responses(0).message() == kFastPathHello;
}

std::unique_ptr<StoreServer> StartServer(StoreServerOptions o) {
  o.auth_token = kToken;
  auto s = StoreServer::Start(std::move(o));
  REQUIRE(s.ok());
  return std::move(*s);
}

Client Connect(const std::string& address, bool fast) {
  ClientOptions co{.address = address, .auth_token = kToken};
  co.use_fast_path = fast;
  co.use_unix_socket = false;
  co.default_timeout = absl::Seconds(20);
  auto c = Client::Connect(co);
  REQUIRE(c.ok());
  return *c;
}

TEST_CASE("fast path: an unauthenticated peer cannot send more than a small handshake frame") {
  auto server = StartServer({});
  int fd = RawConnect(server->fast_port());
  std::string hdr;
  base::AppendU32LE(100u << 20, &hdr);  // announces a 100 MiB frame
  REQUIRE(send(fd, hdr.data(), 4, MSG_NOSIGNAL) == 4);
  std::string chunk(1 << 20, 'x');
  int64_t sent = 0;
  bool closed = false;
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (sent < (64 << 20) && absl::Now() < deadline && !closed) {
    ssize_t k = send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      sent += k;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 50);
    } else {
      closed = true;  // EPIPE / ECONNRESET: the server closed it
    }
  }
  if (!closed) closed = ClosedByServer(fd, absl::Seconds(2));
  INFO("sent " << sent << " bytes before the server closed the connection");
  CHECK(closed);
  CHECK(sent < (32 << 20));  // only socket buffers' worth, nothing like the announced frame
  close(fd);
}

TEST_CASE("fast path: connections are bounded; the oldest unauthenticated one makes room") {
  StoreServerOptions o;
  o.fast_path_limits.max_connections = 8;
  o.fast_path_limits.max_connections_per_peer = 8;
  auto server = StartServer(o);
  const int port = server->fast_port();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(RawConnect(port));
  absl::SleepFor(absl::Milliseconds(200));

  // Full of silent connections: a real client still gets in, the oldest silent one goes.
  int good = RawConnect(port);
  REQUIRE(FastHandshake(good, kToken));
  CHECK(ClosedByServer(idle[0], absl::Seconds(2)));
  CHECK_FALSE(ClosedByServer(idle[7], absl::Milliseconds(200)));

  // Full of authenticated connections: a new one is refused at once.
  std::vector<int> authed = {good};
  for (int i = 1; i < 8; ++i) {
    authed.push_back(RawConnect(port));
    REQUIRE(FastHandshake(authed.back(), kToken));
  }
  int extra = RawConnect(port);
  CHECK(ClosedByServer(extra, absl::Seconds(2)));
  for (int fd : idle) close(fd);
  for (int fd : authed) close(fd);
  close(extra);
}

TEST_CASE("fast path: partial requests buffered across connections are bounded") {
  StoreServerOptions o;
  o.fast_path_limits.max_buffered_input_bytes = 8 << 20;
  auto server = StartServer(o);
  int fd = RawConnect(server->fast_port());
  REQUIRE(FastHandshake(fd, kToken));
  std::string frame;
  base::AppendU32LE(200u << 20, &frame);  // a token holder announces a 200 MiB frame
  frame += std::string(32 << 20, 'x');    // and sends 32 MiB of it
  int64_t sent = 0;
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (sent < static_cast<int64_t>(frame.size()) && absl::Now() < deadline) {
    ssize_t k = send(fd, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      sent += k;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 50);
    } else {
      break;  // closed by the server
    }
  }
  INFO("sent " << sent << " bytes");
  CHECK(ClosedByServer(fd, absl::Seconds(3)));
  close(fd);
  // Others are unaffected.
  Client c = Connect(server->address(), true);
  CHECK(c.Set("k", "v").ok());
}

TEST_CASE("fast path: a client that stops reading is closed at max_unsent_output_bytes") {
  StoreServerOptions o;
  o.backend.max_value_bytes = 1 << 20;
  o.backend.max_response_bytes = 4 << 20;
  o.fast_path_limits.max_unsent_output_bytes = 8 << 20;
  auto server = StartServer(o);
  Client c = Connect(server->address(), true);
  REQUIRE(c.Set("big", std::string(1 << 20, 'z')).ok());
  int fd = RawConnect(server->fast_port());
  REQUIRE(FastHandshake(fd, kToken));
  v1::RequestBatch batch;
  for (int i = 0; i < 64; ++i) {  // 64 MiB of answers, never read
    auto* r = batch.add_requests();
    r->set_id(i + 1);
    r->mutable_get()->set_key("big");
  }
  std::string payload = batch.SerializeAsString(), frame;
  base::AppendU32LE(static_cast<uint32_t>(payload.size()), &frame);
  frame += payload;
  REQUIRE(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
  absl::SleepFor(absl::Milliseconds(500));
  timeval tv{0, 200000};  // a recv that waits for nothing more must not hang the test
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  // Reading now drains what was in flight, then finds the connection closed.
  int64_t drained = 0;
  bool closed = false;
  char buf[1 << 16];
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline) {
    ssize_t k = recv(fd, buf, sizeof(buf), 0);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (k <= 0) {
      closed = true;
      break;
    }
    drained += k;
  }
  INFO("read " << drained << " bytes before the end");
  CHECK(closed);
  CHECK(drained < (40 << 20));
  close(fd);
  CHECK(c.Get("big").ok());
}

TEST_CASE("gRPC: connections are bounded; a client gets in past a flood of silent ones") {
  StoreServerOptions o;
  o.fast_path = false;
  o.max_grpc_connections = 8;
  o.max_grpc_connections_per_peer = 8;
  auto server = StartServer(o);
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(RawConnect(server->port()));
  // The 12 beyond the limit are closed at once; the first 8 are held until they need the room.
  int closed = 0;
  for (int i = 8; i < 20; ++i) closed += ClosedByServer(idle[i], absl::Seconds(2));
  CHECK(closed == 12);
  absl::SleepFor(absl::Milliseconds(1200));  // past the grace period of unauthenticated ones
  Client c = Connect(server->address(), /*fast=*/false);
  REQUIRE(c.Set("k", "v").ok());
  CHECK(*c.Get("k") == "v");
  CHECK(ClosedByServer(idle[0], absl::Seconds(2)));
  for (int fd : idle) close(fd);
}

TEST_CASE("an answer above max_response_bytes is RESOURCE_EXHAUSTED naming the limit") {
  StoreServerOptions o;
  o.backend.max_value_bytes = 1 << 20;
  o.backend.max_response_bytes = 4 << 20;
  auto server = StartServer(o);
  for (bool fast : {true, false}) {
    Client c = Connect(server->address(), fast);
    std::vector<std::string> keys;
    for (int i = 0; i < 10; ++i) {
      keys.push_back(absl::StrCat("big/", i));
      REQUIRE(c.Set(keys.back(), std::string(1 << 20, 'a' + i)).ok());
    }
    auto all = c.MultiGet(keys);
    REQUIRE(absl::IsResourceExhausted(all.status()));
    CHECK(all.status().message().find("max_response_bytes=4194304") != std::string::npos);
    auto few = c.MultiGet({keys[0], keys[1], keys[2]});  // 3 MiB: fits
    REQUIRE(few.ok());
    CHECK((*few)[2] == std::string(1 << 20, 'c'));
  }
}

// A raw Session stream, for what the Client never does (huge batches, not reading answers).
struct RawSession {
  explicit RawSession(const std::string& address, absl::Duration deadline) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub = v1::Store::NewStub(channel);
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    stream = stub->Session(&ctx);
  }
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Store::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RequestBatch, v1::ResponseBatch>> stream;
};

TEST_CASE("gRPC Session: a batch whose answers exceed one message is split, none lost") {
  StoreServerOptions o;
  o.fast_path = false;
  o.backend.max_value_bytes = 1 << 20;
  o.backend.max_response_bytes = 4 << 20;  // messages are then at most ~5 MiB
  auto server = StartServer(o);
  Client c = Connect(server->address(), false);
  REQUIRE(c.Set("big", std::string(1 << 20, 'z')).ok());
  RawSession s(server->address(), absl::Seconds(20));
  v1::RequestBatch batch;
  for (int i = 0; i < 24; ++i) {  // 24 MiB of answers to one batch
    auto* r = batch.add_requests();
    r->set_id(i + 1);
    r->mutable_get()->set_key("big");
  }
  REQUIRE(s.stream->Write(batch));
  s.stream->WritesDone();
  int got = 0, messages = 0;
  v1::ResponseBatch rb;
  while (s.stream->Read(&rb)) {
    ++messages;
    for (const auto& r : rb.responses()) {
      CHECK(r.code() == 0);
      got += r.get().value().size() == (1u << 20);
    }
  }
  grpc::Status st = s.stream->Finish();
  INFO(st.error_message());
  CHECK(st.ok());
  CHECK(got == 24);
  CHECK(messages >= 5);
}

TEST_CASE("gRPC Session: a client that stops reading is cut off at max_unsent_bytes_per_stream") {
  StoreServerOptions o;
  o.fast_path = false;
  o.backend.max_value_bytes = 1 << 20;
  o.backend.max_response_bytes = 4 << 20;
  o.max_unsent_bytes_per_stream = 16 << 20;
  auto server = StartServer(o);
  Client c = Connect(server->address(), false);
  REQUIRE(c.Set("big", std::string(1 << 20, 'z')).ok());
  RawSession s(server->address(), absl::Seconds(15));
  v1::RequestBatch batch;
  for (int i = 0; i < 8; ++i) {
    auto* r = batch.add_requests();
    r->set_id(i + 1);
    r->mutable_get()->set_key("big");
  }
  // 8 MiB of answers per batch, not read until all are sent: transport windows take a few MiB,
  // the rest queues in the server until the limit ends the session.
  for (int i = 0; i < 12 && s.stream->Write(batch); ++i) {
  }
  s.stream->WritesDone();
  int got = 0;
  v1::ResponseBatch rb;
  while (s.stream->Read(&rb)) got += rb.responses_size();
  grpc::Status st = s.stream->Finish();
  INFO(st.error_message() << "; answers received: " << got << " of " << 12 * 8);
  CHECK(st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(st.error_message().find("max_unsent_bytes_per_stream") != std::string::npos);
  CHECK(got < 12 * 8);
}

// --- a real ember-store process under a small descriptor limit -------------------------------

TEST_CASE("a connection flood up to the descriptor limit leaves ember-store serving") {
  // The attacker needs descriptors too.
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  const int per_port = static_cast<int>(std::min<rlim_t>(600, (rl.rlim_cur - 200) / 2));
  REQUIRE(per_port > 300);  // well past the store's limit of 256 descriptors

  char tmpl[] = "/tmp/ember-store-flood-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::string port_file = dir + "/port", token_file = dir + "/token";
  std::ofstream(token_file) << kToken << "\n";
  // Stands in for systemd: ember-store reports READY=1 / WATCHDOG=1 here.
  std::string notify_path = dir + "/notify";
  int notify = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un na{};
  na.sun_family = AF_UNIX;
  std::snprintf(na.sun_path, sizeof(na.sun_path), "%s", notify_path.c_str());
  REQUIRE(bind(notify, reinterpret_cast<sockaddr*>(&na), sizeof(na)) == 0);
  auto drain_notify = [&] {
    std::string all;
    char buf[4096];
    ssize_t k;
    while ((k = recv(notify, buf, sizeof(buf), 0)) > 0) all.append(buf, k).append("\n");
    return all;
  };
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a test that died
    rlimit small{256, 256};  // soft = hard: raising to the hard limit does not help
    setrlimit(RLIMIT_NOFILE, &small);
    setenv("NOTIFY_SOCKET", notify_path.c_str(), 1);
    setenv("WATCHDOG_USEC", "900000", 1);  // a probe every 300 ms
    std::string bin = StoreBinary();
    std::string a1 = "--port-file=" + port_file, a2 = "--auth-token-file=" + token_file;
    execl(bin.c_str(), bin.c_str(), "--listen=127.0.0.1:0", a1.c_str(), a2.c_str(),
          "--log_level=error", static_cast<char*>(nullptr));
    _exit(127);
  }
  const int port = WaitPort(port_file);
  std::string addr = absl::StrCat("127.0.0.1:", port);
  int fast_port = 0;
  {
    Client c = Connect(addr, true);
    REQUIRE(c.Set("before", "1").ok());
    auto stub = v1::Store::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    v1::InfoResponse info;
    REQUIRE(stub->Info(&ctx, {}, &info).ok());
    fast_port = info.fast_port();
    REQUIRE(fast_port > 0);
  }

  absl::SleepFor(absl::Milliseconds(400));
  CHECK(drain_notify().find("READY=1") != std::string::npos);
  // The attacker's own connects may fail once the store sheds or its backlog is full (that is
  // the store defending itself); what counts is that far more than its 256 descriptors were tried.
  std::vector<int> flood;
  int attempts = 0;
  for (int i = 0; i < per_port; ++i) {
    for (int p : {port, fast_port}) {
      ++attempts;
      if (int fd = TryRawConnect(p); fd >= 0) flood.push_back(fd);
    }
  }
  INFO("flood: " << flood.size() << " of " << attempts << " connects succeeded");
  REQUIRE(flood.size() > 300);
  absl::SleepFor(absl::Milliseconds(1500));  // let the store accept (or refuse) all of them
  drain_notify();
  absl::SleepFor(absl::Milliseconds(700));
  // Its watchdog probe (a new connection and a read, through each listener) still succeeds.
  CHECK(drain_notify().find("WATCHDOG=1") != std::string::npos);
  // Both listeners still serve a client with the token, over gRPC and over the fast path.
  {
    Client g = Connect(addr, false);
    REQUIRE(g.Set("during/grpc", "2").ok());
    CHECK(*g.Get("before") == "1");
    Client f = Connect(addr, true);
    REQUIRE(f.Set("during/fast", "3").ok());
    CHECK(*f.Get("during/grpc") == "2");
  }
  for (int fd : flood) close(fd);
  absl::SleepFor(absl::Milliseconds(300));
  {
    Client g = Connect(addr, false);
    CHECK(*g.Get("during/fast") == "3");
  }
  CHECK(waitpid(pid, nullptr, WNOHANG) == 0);  // still running
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  close(notify);
  std::system(("rm -rf " + dir).c_str());
}

int64_t PeakRssKb(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

TEST_CASE("unauthenticated 60 MB calls are refused and the store keeps serving (peak RSS reported)") {
  // Measured on 2 cores (issue 12): ~370 MiB with the default 65 MiB message limit, ~410 MiB with
  // --max-value-bytes=1MiB (a 5 MiB limit: gRPC 1.51 still reads the whole body before rejecting
  // it), and no change with a 128 MiB gRPC resource quota. So this checks only that the calls are
  // refused and the store survives; the memory they cost is reported, not bounded.
  for (const char* limits : {"--max_value_bytes=16777216"}) {
    char tmpl[] = "/tmp/ember-store-bigcall-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    std::string port_file = dir + "/port", token_file = dir + "/token";
    std::ofstream(token_file) << kToken << "\n";
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a test that died
      std::string bin = StoreBinary();
      std::string a1 = "--port-file=" + port_file, a2 = "--auth-token-file=" + token_file;
      execl(bin.c_str(), bin.c_str(), "--listen=127.0.0.1:0", a1.c_str(), a2.c_str(), limits,
            "--max_response_bytes=67108864", "--log_level=error", static_cast<char*>(nullptr));
      _exit(127);
    }
    const int port = WaitPort(port_file);
    std::string addr = absl::StrCat("127.0.0.1:", port);
    absl::SleepFor(absl::Milliseconds(300));
    int64_t before = PeakRssKb(pid);
    v1::SetRequest req;
    req.set_key("k");
    req.set_value(std::string(60 << 20, 'x'));
    std::vector<std::thread> callers;
    std::atomic<int> refused{0};
    for (int t = 0; t < 4; ++t) {
      callers.emplace_back([&] {
        auto stub = v1::Store::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
        grpc::ClientContext ctx;  // no token
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
        v1::SetResponse resp;
        grpc::Status st = stub->Set(&ctx, req, &resp);
        refused += st.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                   st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      });
    }
    for (auto& c : callers) c.join();
    int64_t after = PeakRssKb(pid);
    WARN(limits << ": 4 concurrent unauthenticated 60 MiB Set calls raised ember-store's peak RSS by "
                << (after - before) / 1024 << " MiB");
    CHECK(refused == 4);
    Client c = Connect(addr, false);
    CHECK(c.Set("after", "1").ok());
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    std::system(("rm -rf " + dir).c_str());
  }
}

}  // namespace
}  // namespace ember::store
