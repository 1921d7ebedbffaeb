// A minimal blocking HTTP/1.1 client for loopback tools and tests (emberctl, telemetry tests):
// one request per connection, the whole response read into memory.
//
//   ASSIGN_OR_RETURN(HttpResult r, HttpFetch("127.0.0.1:9400", {.path = "/metrics"}));
//
// Not for untrusted servers at scale: the response is capped at `max_response_bytes` (then
// ResourceExhausted) and the whole exchange at `timeout` (then DeadlineExceeded). Plain HTTP only.
// Thread-compatible (no shared state).
#ifndef EMBER_RUNTIME_BASE_HTTP_CLIENT_H_
#define EMBER_RUNTIME_BASE_HTTP_CLIENT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ember::base {

struct HttpFetchRequest {
  std::string method = "GET";
  std::string path = "/";  // with the query, e.g. "/api/jobs?x=1"
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  absl::Duration timeout = absl::Seconds(10);
  int64_t max_response_bytes = 64 << 20;
};

struct HttpResult {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  std::string Header(absl::string_view lower_name) const;  // first match, "" if absent
};

// Connects to `address` (host:port, [v6]:port), sends the request with Host, Content-Length and
// Connection: close, and reads the response to EOF (or Content-Length). Unavailable when the
// connection fails, DataLoss for a malformed response.
absl::StatusOr<HttpResult> HttpFetch(const std::string& address, const HttpFetchRequest& request);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_HTTP_CLIENT_H_
