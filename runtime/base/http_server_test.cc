// HttpServer over real loopback sockets, with base::HttpFetch and raw sockets as the clients.
#include "runtime/base/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <chrono>
#include <stdexcept>
#include <thread>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "runtime/base/http_client.h"

namespace ember::base {
namespace {

std::unique_ptr<HttpServer> MustStart(HttpServerOptions options = {}) {
  auto server = HttpServer::Start(options);
  REQUIRE(server.ok());
  return std::move(*server);
}

HttpResult Get(const HttpServer& s, const std::string& path, HttpFetchRequest req = {}) {
  req.path = path;
  auto r = HttpFetch(s.address(), req);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

int RawConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

// Reads until the peer closes or `limit` passes; returns what arrived, and whether it closed.
std::pair<std::string, bool> ReadUntilClose(int fd, std::chrono::milliseconds limit) {
  std::string in;
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return {in, true};
    in.append(buf, n);
  }
  return {in, false};
}

TEST_CASE("http server routes by longest prefix and 404s the rest") {
  auto server = MustStart();
  REQUIRE(server->port() > 0);
  REQUIRE(server->address() == absl::StrCat("127.0.0.1:", server->port()));
  server->Handle("/jobs/", [](const HttpRequest& r) {
    return HttpResponse{.body = "jobs:" + r.path};
  });
  server->Handle("/jobs/special", [](const HttpRequest&) { return HttpResponse{.body = "special"}; });
  REQUIRE(Get(*server, "/jobs/7").body == "jobs:/jobs/7");
  REQUIRE(Get(*server, "/jobs/special/x").body == "special");
  HttpResult missing = Get(*server, "/nothing");
  REQUIRE(missing.status == 404);
  REQUIRE(Get(*server, "/jobs").status == 404);  // "/jobs/" is not a prefix of "/jobs"
  // Registered after Start; replaces nothing else.
  server->Handle("/", [](const HttpRequest&) { return HttpResponse{.status = 204}; });
  REQUIRE(Get(*server, "/nothing").status == 204);
  REQUIRE(Get(*server, "/jobs/1").body == "jobs:/jobs/1");
}

TEST_CASE("http server passes method, query, headers, cookies and body") {
  auto server = MustStart();
  HttpRequest seen;
  server->Handle("/api/", [&](const HttpRequest& r) {
    seen = r;
    HttpResponse resp{.status = 201, .content_type = "application/json", .body = "{}"};
    resp.headers.push_back({"Set-Cookie", "ember_token=abc; HttpOnly"});
    resp.headers.push_back({"X-Evil", "a\r\nInjected: 1"});
    return resp;
  });
  HttpFetchRequest req;
  req.method = "POST";
  req.body = std::string(1000, 'b');
  req.headers = {{"Authorization", "Bearer s3cret"},
                 {"Cookie", "other=1; ember_token=\"tok en\"; last=2"}};
  HttpResult r = Get(*server, "/api/v1/x%20y?a=1&b=%20", req);
  REQUIRE(r.status == 201);
  REQUIRE(r.Header("content-type") == "application/json");
  REQUIRE(r.Header("set-cookie") == "ember_token=abc; HttpOnly");
  REQUIRE(r.Header("x-evil").empty());
  REQUIRE(r.Header("injected").empty());
  REQUIRE(r.body == "{}");
  REQUIRE(seen.method == "POST");
  REQUIRE(seen.path == "/api/v1/x y");
  REQUIRE(seen.query == "a=1&b=%20");
  REQUIRE(seen.body == req.body);
  REQUIRE(seen.remote_addr == "127.0.0.1");
  REQUIRE(seen.Header("authorization") == "Bearer s3cret");
  REQUIRE(seen.Header("x-missing").empty());
  REQUIRE(seen.Cookie("ember_token") == "tok en");
  REQUIRE(seen.Cookie("last") == "2");
  REQUIRE(seen.Cookie("ember").empty());
}

TEST_CASE("http server refuses bodies over the limit with 413 and survives handler exceptions") {
  auto server = MustStart({.max_body_bytes = 1024});
  std::atomic<int> calls{0};
  server->Handle("/up", [&](const HttpRequest& r) {
    ++calls;
    return HttpResponse{.body = std::to_string(r.body.size())};
  });
  server->Handle("/throw", [](const HttpRequest&) -> HttpResponse {
    throw std::runtime_error("boom");
  });
  HttpFetchRequest at{.method = "POST", .body = std::string(1024, 'x')};
  REQUIRE(Get(*server, "/up", at).body == "1024");
  HttpFetchRequest over{.method = "POST", .body = std::string(1 << 20, 'x')};
  HttpResult big = Get(*server, "/up", over);
  REQUIRE(big.status == 413);
  REQUIRE(calls == 1);
  HttpResult thrown = Get(*server, "/throw");
  REQUIRE(thrown.status == 500);
  REQUIRE(thrown.body.find("boom") == std::string::npos);
  REQUIRE(Get(*server, "/up").status == 200);
}

TEST_CASE("http server bounds headers, idle peers and concurrency") {
  auto server = MustStart({.threads = 2, .request_timeout_ms = 300, .max_header_bytes = 4096});
  std::atomic<int> active{0}, peak{0};
  server->Handle("/slow", [&](const HttpRequest&) {
    int now = ++active;
    for (int p = peak; now > p && !peak.compare_exchange_weak(p, now);) {}
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    --active;
    return HttpResponse{.body = "ok"};
  });
  SECTION("oversized headers are refused") {
    HttpFetchRequest req;
    req.headers = {{"X-Big", std::string(8000, 'h')}};
    auto r = HttpFetch(server->address(), [&] { req.path = "/slow"; return req; }());
    if (r.ok()) REQUIRE(r->status >= 400);  // civetweb answers 413 or drops the connection
  }
  SECTION("a peer that sends nothing is dropped after the request timeout") {
    int fd = RawConnect(server->port());
    auto start = std::chrono::steady_clock::now();
    auto [data, closed] = ReadUntilClose(fd, std::chrono::milliseconds(5000));
    close(fd);
    REQUIRE(closed);
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(3000));
    REQUIRE(Get(*server, "/slow").body == "ok");  // the thread is free again
  }
  SECTION("at most `threads` requests run at once; the rest wait and succeed") {
    std::vector<std::thread> clients;
    std::atomic<int> ok{0};
    for (int i = 0; i < 6; ++i) {
      clients.emplace_back([&] {
        auto r = HttpFetch(server->address(), {.path = "/slow"});
        if (r.ok() && r->status == 200) ++ok;
      });
    }
    for (auto& t : clients) t.join();
    REQUIRE(ok == 6);
    REQUIRE(peak <= 2);
    REQUIRE(peak >= 1);
  }
}

// Slow peers (issue 31): 20 sockets trickling their headers do not starve /metrics; one address
// may hold at most max_bodies_per_client threads with slow bodies; a body trickled a byte at a
// time ends at the request deadline with 408.
bool SendStr(int fd, const std::string& s) {
  return send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
}

TEST_CASE("http server: 20 slowloris sockets do not starve /metrics scrapes") {
  auto server = MustStart();  // the defaults emberd uses
  server->Handle("/metrics", [](const HttpRequest&) { return HttpResponse{.body = "up 1\n"}; });
  std::atomic<bool> stop{false};
  std::vector<int> fds;
  for (int i = 0; i < 20; ++i) {
    fds.push_back(RawConnect(server->port()));
    REQUIRE(SendStr(fds.back(), "GET /metrics HTTP/1.1\r\nHost: x\r\n"));
  }
  std::thread trickle([&] {  // a header byte per socket every 200 ms, never the blank line
    while (!stop) {
      for (int fd : fds) SendStr(fd, "X");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // every slow socket has a thread
  int ok = 0;
  for (int i = 0; i < 5; ++i) {
    auto r = HttpFetch(server->address(), {.path = "/metrics", .timeout = absl::Seconds(2)});
    if (r.ok() && r->status == 200 && r->body == "up 1\n") ++ok;
  }
  stop = true;
  trickle.join();
  for (int fd : fds) close(fd);
  CHECK(ok == 5);
}

TEST_CASE("http server: one address holds at most max_bodies_per_client slow bodies") {
  auto server = MustStart({.max_bodies_per_client = 3});
  server->Handle("/post", [](const HttpRequest& r) { return HttpResponse{.body = r.body}; });
  server->Handle("/metrics", [](const HttpRequest&) { return HttpResponse{.body = "up 1\n"}; });
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) {
    fds.push_back(RawConnect(server->port()));
    REQUIRE(SendStr(fds.back(), "POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\na"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // The fourth and fifth are refused at once, unread; the first three still wait for their bodies.
  int refused = 0;
  for (int fd : fds) {
    auto [data, closed] = ReadUntilClose(fd, std::chrono::milliseconds(300));
    if (data.find(" 503 ") != std::string::npos) ++refused;
  }
  CHECK(refused == 2);
  // A scrape from the same address has no body: never refused for it.
  auto r = HttpFetch(server->address(), {.path = "/metrics", .timeout = absl::Seconds(2)});
  REQUIRE(r.ok());
  CHECK(r->status == 200);
  for (int fd : fds) close(fd);
}

TEST_CASE("http server: a body trickled a byte at a time ends at the request deadline with 408") {
  auto server = MustStart({.request_timeout_ms = 600});
  server->Handle("/post", [](const HttpRequest& r) { return HttpResponse{.body = r.body}; });
  const int fd = RawConnect(server->port());
  REQUIRE(SendStr(fd, "POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"));
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop && SendStr(fd, "b")) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  });
  const auto start = std::chrono::steady_clock::now();
  std::string data;  // until the answer's status line arrived
  while (data.find("\r\n") == std::string::npos &&
         std::chrono::steady_clock::now() - start < std::chrono::milliseconds(4000)) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  const auto took = std::chrono::steady_clock::now() - start;
  stop = true;
  trickle.join();
  close(fd);
  INFO(data);
  CHECK(data.find(" 408 ") != std::string::npos);
  CHECK(took < std::chrono::milliseconds(2500));
}

// civetweb's threads have 100 KiB stacks; a handler needing more (deep recursion, big buffers, a
// gRPC call) must still work.
int DeepStack(int depth) {
  volatile char pad[1024];
  pad[0] = static_cast<char>(depth);
  return depth == 0 ? pad[0] : DeepStack(depth - 1) + pad[0] - pad[0] + 1;
}

TEST_CASE("http server handlers get a full-size stack") {
  auto server = MustStart();
  server->Handle("/deep", [](const HttpRequest&) {
    std::vector<char> unused;
    char big[512 << 10];  // 512 KiB on the stack: five times civetweb's
    std::memset(big, 1, sizeof(big));
    return HttpResponse{.body = std::to_string(DeepStack(1000) + big[4096] - 1)};
  });
  REQUIRE(Get(*server, "/deep").body == "1000");
}

TEST_CASE("http server start errors name the address") {
  auto first = MustStart();
  auto clash = HttpServer::Start({.listen = first->address()});
  REQUIRE(clash.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE(clash.status().message().find(first->address()) != std::string::npos);
  REQUIRE(HttpServer::Start({.listen = "nonsense"}).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(HttpServer::Start({.threads = 0}).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ember::base
