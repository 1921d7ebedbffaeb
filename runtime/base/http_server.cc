#include "runtime/base/http_server.h"

#include <civetweb.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <system_error>
#include <atomic>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "runtime/base/http_client.h"
#include "spdlog/spdlog.h"

namespace ember::base {
namespace {

void InitCivetweb() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

int LogCivetweb(const mg_connection*, const char* message) {
  spdlog::warn("http server: {}", message);
  return 1;  // handled: civetweb prints nothing itself
}

bool HasLineBreak(absl::string_view s) {
  return s.find_first_of("\r\n") != absl::string_view::npos;
}

HttpResponse Plain(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

// Splits "host:port" / "[v6]:port" into civetweb's listening_ports syntax and the host part.
absl::Status ParseListen(const std::string& listen, std::string* host, int* port) {
  size_t colon = listen.rfind(':');
  int p = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &p) || p < 0 ||
      p > 65535 || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http listen address '", listen, "' is not IPv4 host:port (e.g. 127.0.0.1:9400, 0.0.0.0:0)"));
  }
  *host = listen.substr(0, colon);
  *port = p;
  return absl::OkStatus();
}

}  // namespace

std::string HttpRequest::Header(absl::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return "";
}

std::string HttpRequest::Cookie(absl::string_view name) const {
  for (const auto& [hname, value] : headers) {
    if (hname != "cookie") continue;
    for (absl::string_view part : absl::StrSplit(value, ';')) {
      part = absl::StripAsciiWhitespace(part);
      size_t eq = part.find('=');
      if (eq == absl::string_view::npos || part.substr(0, eq) != name) continue;
      absl::string_view v = part.substr(eq + 1);
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      return std::string(v);
    }
  }
  return "";
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options) {
  if (options.threads < 1 || options.threads > 1024 || options.max_body_bytes < 0 ||
      options.request_timeout_ms < 1 || options.max_header_bytes < 1024 || options.queue < 1 ||
      options.max_bodies_per_client < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http server bounds out of range: threads=", options.threads, " (1-1024), max_body_bytes=",
        options.max_body_bytes, " (>= 0), request_timeout_ms=", options.request_timeout_ms,
        " (>= 1), max_header_bytes=", options.max_header_bytes, " (>= 1024), queue=",
        options.queue, " (>= 1), max_bodies_per_client=", options.max_bodies_per_client,
        " (>= 1)"));
  }
  std::string host;
  int port = 0;
  if (absl::Status s = ParseListen(options.listen, &host, &port); !s.ok()) return s;
  InitCivetweb();

  std::unique_ptr<HttpServer> server(new HttpServer(options));
  const std::string threads = std::to_string(options.threads);
  const std::string timeout = std::to_string(options.request_timeout_ms);
  const std::string header = std::to_string(options.max_header_bytes);
  const std::string queue = std::to_string(options.queue);
  const char* config[] = {
      "listening_ports", options.listen.c_str(),
      "num_threads", threads.c_str(),
      "request_timeout_ms", timeout.c_str(),
      "max_request_size", header.c_str(),
      "connection_queue", queue.c_str(),
      "listen_backlog", queue.c_str(),
      "enable_keep_alive", "no",
      "enable_directory_listing", "no",
      "access_control_allow_origin", "",
      "decode_url", "yes",
      nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = &LogCivetweb;
  mg_init_data init{&callbacks, server.get(), config};
  char error_text[256] = {0};
  unsigned error_code = 0;
  mg_error_data error{&error_code, error_text, sizeof(error_text)};
  server->ctx_ = mg_start2(&init, &error);
  if (server->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("http server cannot listen on ", options.listen,
                                               ": ", error_text,
                                               " (is the port in use, or the host not local?)"));
  }
  mg_set_request_handler(server->ctx_, "/", &HttpServer::Dispatch, server.get());
  // Authorisation is the handlers' (tokens, cookies). Without an auth handler civetweb 1.15 looks
  // for .htpasswd files on every request, on its own (small) stack: not wanted, and not safe.
  mg_set_auth_handler(
      server->ctx_, "/", [](mg_connection*, void*) { return 1; }, nullptr);
  mg_server_port ports[4];
  int n = mg_get_server_ports(server->ctx_, 4, ports);
  if (n < 1) return absl::InternalError("http server started but reports no listening port");
  server->port_ = ports[0].port;
  server->address_ = absl::StrCat(host, ":", server->port_);
  return server;
}

HttpServer::~HttpServer() {
  if (ctx_ == nullptr) return;
  // mg_stop waits for in-flight requests and joins the threads, but civetweb's accept loop only
  // sees the stop flag when its poll (2 s quantum) returns: knock on the port until it has gone.
  stopping_ = true;  // requests from here on (the knocks below among them) get 503
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    mg_stop(ctx_);
    stopped = true;
  });
  std::string knock = address_;
  if (absl::StartsWith(knock, "0.0.0.0:")) knock = absl::StrCat("127.0.0.1:", port_);
  if (absl::StartsWith(knock, "[::]:")) knock = absl::StrCat("[::1]:", port_);
  for (int i = 0; i < 200 && !stopped; ++i) {
    (void)HttpFetch(knock, {.path = "/", .timeout = absl::Milliseconds(20)});
    absl::SleepFor(absl::Milliseconds(10));
  }
  stopper.join();
}

void HttpServer::Handle(std::string prefix, HttpHandler handler) {
  auto shared = std::make_shared<const HttpHandler>(std::move(handler));
  absl::MutexLock lock(&mu_);
  handlers_[std::move(prefix)] = std::move(shared);
}

std::shared_ptr<const HttpHandler> HttpServer::Route(absl::string_view path) const {
  absl::MutexLock lock(&mu_);
  const std::shared_ptr<const HttpHandler>* best = nullptr;
  size_t best_len = 0;
  for (const auto& [prefix, handler] : handlers_) {
    if (absl::StartsWith(path, prefix) && (best == nullptr || prefix.size() > best_len)) {
      best = &handler;
      best_len = prefix.size();
    }
  }
  return best ? *best : nullptr;
}

HttpResponse HttpServer::Serve(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  HttpRequest req;
  req.method = info->request_method ? info->request_method : "";
  req.path = info->local_uri ? info->local_uri : "";
  req.query = info->query_string ? info->query_string : "";
  req.remote_addr = info->remote_addr;
  for (int i = 0; i < info->num_headers; ++i) {
    req.headers.emplace_back(absl::AsciiStrToLower(info->http_headers[i].name),
                             info->http_headers[i].value ? info->http_headers[i].value : "");
  }
  // Body: refuse a declared length over the limit unread; read an undeclared (chunked) one up to
  // the limit plus one byte to tell "at the limit" from "over".
  if (info->content_length > options_.max_body_bytes) {
    return Plain(413, absl::StrCat("request body of ", info->content_length,
                                   " bytes is over the limit of ", options_.max_body_bytes, "\n"));
  }
  bool has_body = info->content_length > 0;
  for (int i = 0; i < info->num_headers && !has_body; ++i) {
    has_body = absl::EqualsIgnoreCase(info->http_headers[i].name, "transfer-encoding");
  }
  if (has_body) {
    bool ok = false;
    HttpResponse refused = ReadBody(conn, req.remote_addr, info->content_length, &req.body, &ok);
    if (!ok) return refused;
  }
  if (stopping_) return Plain(503, "server stopping\n");
  std::shared_ptr<const HttpHandler> handler = Route(req.path);
  if (handler == nullptr) return Plain(404, absl::StrCat("no such path: ", req.path, "\n"));
  HttpResponse resp = Plain(500, "internal error (see the server log)\n");
  try {
    resp = (*handler)(req);
  } catch (const std::exception& e) {
    spdlog::error("http server: handler for {} {} threw: {}", req.method, req.path, e.what());
  } catch (...) {
    spdlog::error("http server: handler for {} {} threw a non-std exception", req.method, req.path);
  }
  return resp;
}

HttpResponse HttpServer::ReadBody(mg_connection* conn, const std::string& client, int64_t length,
                                  std::string* body, bool* ok) {
  *ok = false;
  {
    absl::MutexLock lock(&mu_);
    int& n = reading_bodies_[client];
    if (n >= options_.max_bodies_per_client) {
      HttpResponse r = Plain(503, absl::StrCat(n, " requests from ", client,
                                               " are sending their bodies already (at most ",
                                               options_.max_bodies_per_client, "); retry later\n"));
      r.headers.push_back({"Retry-After", "1"});
      return r;
    }
    ++n;
  }
  struct Release {
    HttpServer* s;
    const std::string& client;
    ~Release() {
      absl::MutexLock lock(&s->mu_);
      auto it = s->reading_bodies_.find(client);
      if (it != s->reading_bodies_.end() && --it->second <= 0) s->reading_bodies_.erase(it);
    }
  } release{this, client};
  // The whole body within request_timeout_ms: a client trickling a byte per read timeout would
  // otherwise hold the thread for as long as it likes.
  const absl::Time deadline = absl::Now() + absl::Milliseconds(options_.request_timeout_ms);
  // civetweb's mg_read returns only when all it was asked for arrived (or a read timed out): the
  // reads double from 1 byte, so that one started before the deadline ends by about twice the
  // deadline (a trickling client needs as long for each read as for all before it).
  const int64_t cap = options_.max_body_bytes + 1;
  char buf[4096];
  size_t chunk = 1;
  while (static_cast<int64_t>(body->size()) < cap) {
    if (absl::Now() > deadline) {
      return Plain(408, absl::StrCat("request body not received within ",
                                     options_.request_timeout_ms, " ms (", body->size(), " of ",
                                     length < 0 ? std::string("?") : absl::StrCat(length),
                                     " bytes)\n"));
    }
    size_t want = std::min<int64_t>(chunk, cap - body->size());
    int got = mg_read(conn, buf, want);
    if (got <= 0) break;
    body->append(buf, got);
    chunk = std::min(sizeof(buf), std::max<size_t>(chunk, body->size()));
  }
  if (static_cast<int64_t>(body->size()) > options_.max_body_bytes) {
    return Plain(413, absl::StrCat("request body is over the limit of ", options_.max_body_bytes,
                                   " bytes\n"));
  }
  *ok = true;
  return HttpResponse{};
}

// civetweb's threads have 100 KiB stacks (a build-time setting), and glibc carves every loaded
// library's static TLS out of them (OpenBLAS alone takes 60 KiB in processes that link the
// kernels, as emberctl does): so the civetweb thread does nothing but start a thread with the
// default stack, which serves the request (reads it, runs the handler, writes the answer) while
// the civetweb thread waits; `threads` still bounds how many run at once.
int HttpServer::Dispatch(mg_connection* conn, void* self) {
  int status = 0;
  try {
    std::thread([&] { status = static_cast<HttpServer*>(self)->Respond(conn); }).join();
  } catch (const std::system_error&) {  // no thread to be had: answer with what is left here
    static const char kBusy[] =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    mg_write(conn, kBusy, sizeof(kBusy) - 1);
    return 503;
  }
  return status;
}

int HttpServer::Respond(mg_connection* conn) {
  HttpResponse resp = Serve(conn);
  if (resp.status < 100 || resp.status > 999) resp.status = 500;
  std::string head = absl::StrCat("HTTP/1.1 ", resp.status, " ",
                                  mg_get_response_code_text(conn, resp.status), "\r\n");
  if (!HasLineBreak(resp.content_type)) {
    absl::StrAppend(&head, "Content-Type: ", resp.content_type, "\r\n");
  }
  absl::StrAppend(&head, "Content-Length: ", resp.body.size(), "\r\nConnection: close\r\n",
                  "X-Content-Type-Options: nosniff\r\n");
  for (const auto& [name, value] : resp.headers) {
    if (name.empty() || HasLineBreak(name) || name.find(':') != std::string::npos ||
        HasLineBreak(value)) {
      spdlog::warn("http server: dropped response header '{}' (empty, ':' or line break)",
                   absl::CEscape(name));
      continue;
    }
    absl::StrAppend(&head, name, ": ", value, "\r\n");
  }
  head += "\r\n";
  mg_write(conn, head.data(), head.size());
  const char* method = mg_get_request_info(conn)->request_method;
  if (!resp.body.empty() && !(method != nullptr && std::strcmp(method, "HEAD") == 0)) {
    mg_write(conn, resp.body.data(), resp.body.size());
  }
  return resp.status;  // non-zero: handled
}

}  // namespace ember::base
