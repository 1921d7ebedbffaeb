// Constants of the store's plain-TCP fast path, shared by server (fast_path.h) and client.
// Frame: u32 little-endian length, then a RequestBatch (client->server) or ResponseBatch protobuf.
#ifndef EMBER_RUNTIME_STORE_FAST_PATH_PROTOCOL_H_
#define EMBER_RUNTIME_STORE_FAST_PATH_PROTOCOL_H_

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace ember::store {

// Frames above this size close the connection.
constexpr uint32_t kMaxFastFrameBytes = 256u << 20;
// The message of the single response that acknowledges a successful handshake.
constexpr char kFastPathHello[] = "ember-store fast path v1";

// The abstract Unix socket ("\0ember-store-fast-<tcp port>") a fast-path server also listens on for
// clients on the same host (network namespace). Fills *addr; returns the address length to pass
// to bind/connect.
inline socklen_t FastPathUnixAddress(int tcp_port, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  int n = std::snprintf(addr->sun_path + 1, sizeof(addr->sun_path) - 1, "ember-store-fast-%d",
                        tcp_port);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// The TCP options of a fast-path connection, both ends (they fail harmlessly on Unix sockets):
// - no Nagle (one small frame per round trip);
// - keepalive finds a peer host that vanished without closing the socket (then reconnect);
// - linear retransmission timeouts while few packets are in flight (TCP_THIN_LINEAR_TIMEOUTS: the
//   first 6 retransmits every RTO, ~200 ms here, instead of doubling), so a request sent during a
//   link flap gets through within about one RTO of the link coming back, not after a backoff of
//   seconds: a flap shorter than the daemons' lease is ridden through (tests/multihost).
inline void TuneFastPathSocket(int fd) {
  int one = 1, idle = 20, intvl = 5, cnt = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, &one, sizeof(one));
}

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_FAST_PATH_PROTOCOL_H_
