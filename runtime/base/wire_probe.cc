#include "runtime/base/wire_probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/time/clock.h"

namespace ember::base {
namespace {

bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  if (host->empty() || host->find('/') != std::string::npos) return false;
  return port->find_first_not_of("0123456789") == std::string::npos;
}

// Waits until `fd` is ready for `events` or `deadline` passes.
bool WaitFd(int fd, short events, absl::Time deadline) {
  while (true) {
    int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0) return false;
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, ms);
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

}  // namespace

WireProtocol ProbeWireProtocol(const std::string& address, absl::Duration timeout) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return WireProtocol::kUnknown;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* ai = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &ai) != 0 || ai == nullptr) {
    return WireProtocol::kUnknown;
  }
  const absl::Time deadline = absl::Now() + timeout;
  int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  bool connected = false;
  if (fd >= 0) {
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc == 0) {
      connected = true;
    } else if (errno == EINPROGRESS && WaitFd(fd, POLLOUT, deadline)) {
      int err = 0;
      socklen_t len = sizeof(err);
      connected = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
  }
  ::freeaddrinfo(ai);
  WireProtocol result = WireProtocol::kUnknown;
  // The client connection preface (RFC 9113 section 3.4) and an empty SETTINGS frame.
  static const char kPreface[] =
      "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
      "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
  const size_t preface_len = sizeof(kPreface) - 1;
  if (connected &&
      ::send(fd, kPreface, preface_len, MSG_NOSIGNAL) == static_cast<ssize_t>(preface_len)) {
    unsigned char buf[16];
    size_t got = 0;
    bool closed = false;
    while (got < 5 && WaitFd(fd, POLLIN, deadline)) {
      ssize_t n = ::recv(fd, buf + got, sizeof(buf) - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        closed = true;
        break;
      }
    }
    if (got >= 5 && buf[3] == 0x04) {
      result = WireProtocol::kPlaintext;  // an HTTP/2 frame header of type SETTINGS
    } else if (got >= 2 && buf[0] >= 0x14 && buf[0] <= 0x17 && buf[1] == 0x03) {
      result = WireProtocol::kTls;  // a TLS record: alert or handshake
    } else if (got == 0 && closed) {
      result = WireProtocol::kTls;  // hung up on the preface without a word, as TLS servers do
    }
  }
  if (fd >= 0) ::close(fd);
  return result;
}

TlsDiagnosis DiagnoseTls(WireProtocol p, bool client_uses_tls) {
  if (p == WireProtocol::kTls && !client_uses_tls) {
    return {true,
            "it serves TLS but this client connects without TLS: give the client the cluster's "
            "CA (emberctl --tls-ca, emberd tls_ca, $EMBER_TLS_CA for a worker)"};
  }
  if (p == WireProtocol::kPlaintext && client_uses_tls) {
    return {true,
            "it serves plaintext (no TLS) but this client connects with TLS: start the server "
            "with --tls-cert/--tls-key, or drop the client's TLS settings"};
  }
  if (p == WireProtocol::kTls) {
    return {false,
            "it speaks TLS but the TLS handshake failed: if it requires client certificates "
            "(mTLS), give this client one signed by its CA (--tls-cert/--tls-key, "
            "$EMBER_TLS_CERT/$EMBER_TLS_KEY); check also that its certificate names this address "
            "and that this client trusts its CA"};
  }
  return {};
}

}  // namespace ember::base
