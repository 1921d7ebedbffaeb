// EtcdTestCluster: real etcd members (Debian's etcd-server) for tests, on free loopback ports with
// their own data dirs (tmpfs when /dev/shm exists), started by the constructor and SIGKILLed by the
// destructor; each member also dies with the test process (PR_SET_PDEATHSIG).
//
//   EtcdTestCluster etcd(3);               // REQUIREs all members healthy (3 starts x 20 s at most)
//   etcd.Kill(etcd.Leader());              // kill -9 the raft leader
//
// Not thread-safe: call from the test's main thread (it uses Catch2's REQUIRE).
#ifndef EMBER_RUNTIME_STORE_ETCD_TEST_UTIL_H_
#define EMBER_RUNTIME_STORE_ETCD_TEST_UTIL_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace ember::store::testing {

class EtcdTestCluster {
 public:
  explicit EtcdTestCluster(int members);
  ~EtcdTestCluster();
  EtcdTestCluster(const EtcdTestCluster&) = delete;
  EtcdTestCluster& operator=(const EtcdTestCluster&) = delete;

  std::vector<std::string> endpoints() const;  // "127.0.0.1:<client port>" per member
  void Kill(int member);                        // SIGKILL and reap
  void Restart(int member);                     // same ports and data dir
  // The member that is raft leader now (-1 when no live member says so), via etcdctl.
  int Leader() const;
  // Waits up to `timeout` until every live member answers `etcdctl endpoint health`.
  bool WaitHealthy(double timeout_s) const;
  // Runs `etcdctl <args>` (API v3, 10 s limit) against `member`; its stdout and stderr.
  std::string Etcdctl(int member, const std::string& args) const;

 private:
  struct Member {
    int client_port = 0, peer_port = 0;
    std::string dir;
    pid_t pid = -1;
  };
  void Spawn(int member);
  void StopAll();  // SIGKILLs and reaps every live member

  std::string root_;
  std::string initial_cluster_;
  std::vector<Member> members_;
};

}  // namespace ember::store::testing

#endif  // EMBER_RUNTIME_STORE_ETCD_TEST_UTIL_H_
