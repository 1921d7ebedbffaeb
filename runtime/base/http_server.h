// A small embedded HTTP/1.1 server (civetweb underneath) for emberd's /metrics and job pages.
//
//   ASSIGN_OR_RETURN(auto server, HttpServer::Start({.listen = "127.0.0.1:0"}));
//   server->Handle("/metrics", [](const HttpRequest& r) { return HttpResponse{.body = "..."}; });
//   int port = server->port();
//
// Routing: the longest registered prefix that the request path starts with wins ("/jobs/" beats
// "/"); no match is 404. Handlers run several at once, each on a thread of its own with the
// default stack (civetweb's own threads have only 100 KiB), and must be thread-safe. A handler that throws gives 500 (the exception text is logged, not sent).
//
// Bounds: `threads` connections are served at once (each on its own thread; keep-alive is off, so
// one request per connection); at most `queue` more wait, accepted, for a thread. Request headers
// over `max_header_bytes` are refused by civetweb, a body over `max_body_bytes` gets 413 without
// being read. Deadlines: the headers must arrive within `request_timeout_ms` of a thread taking
// the connection (civetweb's, for the whole header), the body within `request_timeout_ms` of the headers (408
// otherwise), and each write of the answer within `request_timeout_ms`. Slow clients: a client
// that trickles its headers holds a thread for at most `request_timeout_ms`, so `threads` (32)
// must exceed what slow peers can hold for a /metrics scrape to get one: 20 slowloris sockets
// leave 12; and at most `max_bodies_per_client` requests from one client address may be reading
// their bodies at once (the rest get 503 unread), so one address cannot hold every thread with
// slow bodies. Requests without a body are never refused for it. Plain HTTP only: bind it to loopback or a trusted network and
// put authentication in the handlers (see HttpRequest::Header, Cookie).
//
// Thread-safety: Handle() may be called from any thread, before or after Start. The destructor
// answers new requests with 503, waits for in-flight handlers and joins the threads.
#ifndef EMBER_RUNTIME_BASE_HTTP_SERVER_H_
#define EMBER_RUNTIME_BASE_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

struct mg_context;
struct mg_connection;

namespace ember::base {

struct HttpRequest {
  std::string method, path, query, body, remote_addr;  // path URL-decoded, query raw (no '?')
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  // The first header named `lower_name`, "" if absent.
  std::string Header(absl::string_view lower_name) const;
  // The value of cookie `name` from the Cookie header, "" if absent.
  std::string Cookie(absl::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // Extra headers (e.g. Set-Cookie, Cache-Control). Values containing CR/LF are dropped.
  std::vector<std::pair<std::string, std::string>> headers;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerOptions {
  std::string listen = "127.0.0.1:0";  // IPv4 host:port (Debian's civetweb has no IPv6); port 0 = any
  int threads = 32;                      // connections served at once
  int64_t max_body_bytes = 64 << 10;     // larger request bodies get 413
  int request_timeout_ms = 10000;        // per request: receiving it and sending the answer
  int max_header_bytes = 16 << 10;       // request line + headers
  int queue = 16;                        // accepted connections waiting for a thread
  int max_bodies_per_client = 8;         // requests of one address reading their bodies at once
};

class HttpServer {
 public:
  // Binds and starts serving. InvalidArgument for a malformed `listen` or bounds, Unavailable
  // naming the address when the bind fails (in use, no such host).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options);

  // Routes paths starting with `prefix` to `handler` (replacing an earlier one for that prefix).
  // Longest matching prefix wins ("/metrics", "/jobs/", "/api/"). Register before or after Start;
  // thread-safe.
  void Handle(std::string prefix, HttpHandler handler);

  int port() const { return port_; }
  std::string address() const { return address_; }  // host:port actually bound

  ~HttpServer();  // stops, joins
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

 private:
  explicit HttpServer(const HttpServerOptions& options) : options_(options) {}
  static int Dispatch(mg_connection* conn, void* self);
  int Respond(mg_connection* conn);  // Serve, then write the answer; returns the status
  HttpResponse Serve(mg_connection* conn);
  // Reads the body into `body` (request_timeout_ms from now at most); a non-OK answer for errors.
  HttpResponse ReadBody(mg_connection* conn, const std::string& client, int64_t length,
                        std::string* body, bool* ok);
  std::shared_ptr<const HttpHandler> Route(absl::string_view path) const;

  const HttpServerOptions options_;
  mg_context* ctx_ = nullptr;
  std::atomic<bool> stopping_{false};
  int port_ = 0;
  std::string address_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const HttpHandler>> handlers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> reading_bodies_ ABSL_GUARDED_BY(mu_);  // by client address
};

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_HTTP_SERVER_H_
