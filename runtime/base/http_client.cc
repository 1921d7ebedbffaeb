#include "runtime/base/http_client.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace ember::base {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { if (fd_ >= 0) close(fd_); }
  int get() const { return fd_; }
 private:
  int fd_;
};

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline, const std::string& address) {
  for (;;) {
    int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0) return absl::DeadlineExceededError(absl::StrCat("http ", address, ": timed out"));
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, ms);
    if (r > 0) return absl::OkStatus();
    if (r < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("http ", address, ": poll: ", strerror(errno)));
    }
  }
}

absl::StatusOr<int> Connect(const std::string& address, absl::Time deadline) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("http address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("http ", address, ": cannot resolve: ", gai_strerror(rc)));
  }
  std::string last = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (WaitFor(fd, POLLOUT, deadline, address).ok()) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      freeaddrinfo(res);
      return fd;
    }
    last = strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  return absl::UnavailableError(absl::StrCat("http ", address, ": cannot connect: ", last));
}

}  // namespace

std::string HttpResult::Header(absl::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return "";
}

absl::StatusOr<HttpResult> HttpFetch(const std::string& address, const HttpFetchRequest& request) {
  const absl::Time deadline = absl::Now() + request.timeout;
  absl::StatusOr<int> fd_or = Connect(address, deadline);
  if (!fd_or.ok()) return fd_or.status();
  Fd fd(*fd_or);
  std::string out = absl::StrCat(request.method, " ", request.path, " HTTP/1.1\r\nHost: ",
                                 address, "\r\nConnection: close\r\n");
  for (const auto& [name, value] : request.headers) absl::StrAppend(&out, name, ": ", value, "\r\n");
  if (!request.body.empty() || request.method == "POST" || request.method == "PUT") {
    absl::StrAppend(&out, "Content-Length: ", request.body.size(), "\r\n");
  }
  absl::StrAppend(&out, "\r\n", request.body);
  for (size_t sent = 0; sent < out.size();) {
    ssize_t n = send(fd.get(), out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (absl::Status s = WaitFor(fd.get(), POLLOUT, deadline, address); !s.ok()) return s;
    } else {
      // The server may answer (e.g. 413) and close before reading everything: read what it said.
      break;
    }
  }
  std::string in;
  char buf[16384];
  size_t header_end = std::string::npos;
  int64_t content_length = -1;
  for (;;) {
    if (header_end != std::string::npos && content_length >= 0 &&
        static_cast<int64_t>(in.size() - header_end - 4) >= content_length) {
      break;
    }
    ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      in.append(buf, n);
      if (static_cast<int64_t>(in.size()) > request.max_response_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "http ", address, request.path, ": response over ", request.max_response_bytes,
            " bytes"));
      }
      if (header_end == std::string::npos) {
        header_end = in.find("\r\n\r\n");
        if (header_end != std::string::npos) {
          for (absl::string_view line : absl::StrSplit(in.substr(0, header_end), "\r\n")) {
            if (absl::StartsWithIgnoreCase(line, "content-length:")) {
              (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(15)), &content_length);
            }
          }
        }
      }
    } else if (n == 0) {
      break;
    } else if (errno == EAGAIN || errno == EINTR) {
      if (absl::Status s = WaitFor(fd.get(), POLLIN, deadline, address); !s.ok()) return s;
    } else if (errno == ECONNRESET && !in.empty()) {
      break;
    } else {
      return absl::UnavailableError(
          absl::StrCat("http ", address, request.path, ": recv: ", strerror(errno)));
    }
  }
  if (header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("http ", address, request.path,
                                            ": no complete response header in ", in.size(),
                                            " bytes"));
  }
  HttpResult result;
  std::vector<absl::string_view> lines = absl::StrSplit(absl::string_view(in).substr(0, header_end), "\r\n");
  std::vector<absl::string_view> status_line = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status_line.size() < 2 || !absl::StartsWith(status_line[0], "HTTP/") ||
      !absl::SimpleAtoi(status_line[1], &result.status)) {
    return absl::DataLossError(absl::StrCat("http ", address, request.path, ": bad status line '",
                                            lines[0], "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    result.headers.emplace_back(absl::AsciiStrToLower(lines[i].substr(0, colon)),
                                std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1))));
  }
  result.body = in.substr(header_end + 4);
  if (content_length >= 0 && static_cast<int64_t>(result.body.size()) > content_length) {
    result.body.resize(content_length);
  }
  return result;
}

}  // namespace ember::base
