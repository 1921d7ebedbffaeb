// What UCX exposes of an Agent to the network (issue 31; agent.h, "Exposure"): UCX's TCP transport
// writes a peer's put wherever the peer says, with no token, so the agent keeps UCX's interfaces
// to the fewest devices. In a one-host job (EMBER_WORLD_SIZE == EMBER_LOCAL_WORLD_SIZE) every
// TCP socket the agents listen on is bound to loopback, and a put over TCP still arrives byte for
// byte (the agent's own token-checked messages; UCX's TCP put is off). The control: with
// net_devices "all" UCX listens on the host's other devices too (what the old agent did).
#include <ifaddrs.h>
#include <unistd.h>

#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/onesided/agent.h"
#include "runtime/onesided/agent_pair.h"

namespace ember::onesided {
namespace {

// Inodes of this process's sockets.
std::set<std::string> MySocketInodes() {
  std::set<std::string> out;
  DIR* d = opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    char target[256];
    const std::string path = absl::StrCat("/proc/self/fd/", e->d_name);
    const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    const std::string t(target, static_cast<size_t>(n));
    if (absl::StartsWith(t, "socket:[")) out.insert(t.substr(8, t.size() - 9));
  }
  closedir(d);
  return out;
}

// The local addresses (hex, as /proc/net/tcp{,6} writes them) of this process's listening TCP
// sockets that are not bound to loopback.
std::vector<std::string> NonLoopbackListeners() {
  const std::set<std::string> mine = MySocketInodes();
  std::vector<std::string> out;
  for (const char* file : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream f(file);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      in >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A" || mine.count(inode) == 0) continue;  // 0A: LISTEN
      const std::string addr = local.substr(0, local.find(':'));
      const bool loopback = addr.size() == 8 ? absl::EndsWith(addr, "7F")  // 127.x.x.x
                                             : addr == "00000000000000000000000001000000" ||
                                                   absl::EndsWith(addr, "0000FFFF0100007F");
      if (!loopback) out.push_back(local);
    }
  }
  return out;
}

bool HostHasNonLoopbackIpv4() {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return false;
  bool found = false;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
        std::string(i->ifa_name) != "lo") {
      found = true;
    }
  }
  freeifaddrs(ifs);
  return found;
}

TEST_CASE("in a one-host job UCX listens on loopback only, and puts over TCP still arrive") {
  setenv("EMBER_WORLD_SIZE", "2", 1);
  setenv("EMBER_LOCAL_WORLD_SIZE", "2", 1);
  setenv("UCX_TLS", "tcp", 1);
  unsetenv("UCX_NET_DEVICES");
  auto pair = testing::AgentPair::Create();
  unsetenv("UCX_TLS");
  unsetenv("EMBER_WORLD_SIZE");
  unsetenv("EMBER_LOCAL_WORLD_SIZE");
  REQUIRE(pair.ok());
  auto& p = *pair;
  const std::vector<std::string> exposed = NonLoopbackListeners();
  INFO("listening sockets not on loopback: " << exposed.size()
       << (exposed.empty() ? "" : absl::StrCat(" (first ", exposed[0], ")")));
  CHECK(exposed.empty());

  std::vector<char> src(3 << 20), dst(src.size() + 4096, 'z');
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 13 + (i >> 11));
  auto rs = p->a->RegisterMemory(src.data(), src.size());
  auto rd = p->b->RegisterMemory(dst.data(), dst.size());
  REQUIRE(rs.ok());
  REQUIRE(rd.ok());
  auto remote = p->a_to_b->ImportRegion(rd->descriptor);
  REQUIRE(remote.ok());
  REQUIRE(p->a->Put(p->a_to_b, {{rs->id, 0, src.size()}}, {{*remote, 100, src.size()}})
              .Wait(absl::Seconds(20)).ok());
  REQUIRE(p->a->Notify(p->a_to_b, "done").Wait(absl::Seconds(20)).ok());
  REQUIRE(p->b->WaitNotification(absl::Seconds(20)).ok());
  CHECK(std::equal(src.begin(), src.end(), dst.begin() + 100));
  CHECK(dst[99] == 'z');
  CHECK(p->b->refused_puts() == 0);
}

TEST_CASE("control: with net_devices \"all\" UCX listens beyond loopback (when the host has a device)") {
  if (!HostHasNonLoopbackIpv4()) {
    WARN("this host has no IPv4 device besides lo: nothing to compare");
    return;
  }
  setenv("UCX_TLS", "tcp", 1);
  unsetenv("UCX_NET_DEVICES");
  auto pair = testing::AgentPair::Create({.net_devices = "all"});
  unsetenv("UCX_TLS");
  REQUIRE(pair.ok());
  CHECK_FALSE(NonLoopbackListeners().empty());
}

}  // namespace
}  // namespace ember::onesided
