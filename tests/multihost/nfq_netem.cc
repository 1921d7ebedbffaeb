// nfq_netem (issue 20): a userspace stand-in for `tc qdisc add dev eth0 root netem delay D loss P`
// on kernels without sch_netem. Run inside one network namespace. It binds NFQUEUE --queue there,
// then adds an iptables rule that queues the packets crossing --dev to it (the xtables NFQUEUE
// target: nft's own `queue` statement needs CONFIG_NFT_QUEUE, which kernels without netem tend to
// lack too), and for each packet either drops it (probability --loss, one seeded draw per packet)
// or accepts it --delay_ms after it arrived here. The delay is fixed, so the held packets form a
// FIFO and verdicts go out in arrival order (one NFQNL_MSG_VERDICT_BATCH per release). At most
// --limit packets wait (like netem's limit); the kernel drops beyond that. Packets are queued one
// per wire segment (no NFQA_CFG_F_GSO: the kernel segments GSO packets first), so --loss is a
// per-packet loss, and only their metadata is copied (NFQNL_COPY_META).
//
// --direction=ingress (the default) holds the packets arriving on --dev (raw PREROUTING):
// delaying every host's ingress delays every path once, as netem on every egress does. Egress
// (filter OUTPUT) holds packets that still count against their socket, unlike the kernel's netem,
// which orphans them, and TCP's small-queue limit then caps a connection at a few packets per
// delay (measured: 0.9 MB/s at 5 ms and no loss, against 40+ MB/s through ingress).
//
// Prints "nfq_netem: ready ..." on stderr once the rule is in place. On SIGTERM or SIGINT: deletes
// the rule (nothing new is queued), accepts every packet still held, unbinds, prints one
// "nfq_netem: queue N: ..." line of counts and exits 0. Exit 1 on a setup error (nothing left
// behind but, after a bind, the queue binding that the kernel drops with the socket).
// Single-threaded. Needs root (CAP_NET_ADMIN) and iptables on PATH.
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include <libmnl/libmnl.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
}

#include "absl/flags/flag.h"
#include "runtime/base/flags.h"

ABSL_FLAG(int, queue, 7, "NFQUEUE number to bind (per network namespace)");
ABSL_FLAG(double, delay_ms, 5.0, "delay before each kept packet is accepted, milliseconds");
ABSL_FLAG(double, loss, 0.01, "probability that a packet is dropped, 0..1");
ABSL_FLAG(uint64_t, seed, 1, "seed of the loss draws");
ABSL_FLAG(int, limit, 10000, "most packets held at once; the kernel drops beyond it");
ABSL_FLAG(std::string, dev, "eth0",
          "queue the packets crossing this device: an iptables rule added once the queue is "
          "bound and deleted at stop; empty: no rule (the caller queues packets itself)");
ABSL_FLAG(std::string, direction, "ingress",
          "ingress: packets arriving on --dev (raw PREROUTING -i); egress: packets leaving it "
          "(filter OUTPUT -o; see the file comment for why ingress is the default)");

namespace {

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

struct Held {
  uint32_t id;
  int64_t due_ns;
};

struct Counts {
  uint64_t seen = 0, accepted = 0, dropped = 0, errors = 0, max_held = 0;
  uint64_t on_time = 0;                      // accepted when due (not in the flush at stop)
  int64_t late_sum_ns = 0, late_max_ns = 0;  // release time minus due time, over on_time
};

class Netem {
 public:
  Netem(mnl_socket* nl, int queue, int64_t delay_ns, double loss, uint64_t seed, size_t limit)
      : nl_(nl), queue_(queue), delay_ns_(delay_ns), loss_(loss), rng_(seed), limit_(limit) {}

  // Sends a config message (bind, params...) and waits for the kernel's ack; false on an error.
  bool Configure(const char* what, void (*fill)(nlmsghdr*, const Netem&)) {
    char buf[MNL_SOCKET_BUFFER_SIZE];
    nlmsghdr* nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, queue_);
    nlh->nlmsg_flags |= NLM_F_ACK;
    fill(nlh, *this);
    if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) {
      std::fprintf(stderr, "nfq_netem: %s of queue %d: send: %s\n", what, queue_, strerror(errno));
      return false;
    }
    const ssize_t n = mnl_socket_recvfrom(nl_, buf, sizeof(buf));
    if (n < 0 || mnl_cb_run(buf, n, 0, mnl_socket_get_portid(nl_), nullptr, nullptr) < 0) {
      std::fprintf(stderr, "nfq_netem: %s of queue %d refused: %s%s\n", what, queue_,
                   strerror(errno),
                   errno == EBUSY ? " (another process holds this queue)" : "");
      return false;
    }
    return true;
  }
  int limit() const { return static_cast<int>(limit_); }

  // Reads the messages waiting on the socket (at most 64 reads, so releases are not starved under
  // load); decides each packet. Returns false on a socket error other than "nothing to read".
  bool ReadAll() {
    for (int reads = 0; reads < 64; ++reads) {
      const ssize_t n = recv(mnl_socket_get_fd(nl_), rbuf_, sizeof(rbuf_), MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
        if (errno == ENOBUFS) { ++counts_.errors; continue; }  // the kernel already dropped them
        std::fprintf(stderr, "nfq_netem: recv on queue %d: %s\n", queue_, strerror(errno));
        return false;
      }
      const int64_t now = NowNs();
      int len = static_cast<int>(n);
      for (auto* nlh = reinterpret_cast<nlmsghdr*>(rbuf_); mnl_nlmsg_ok(nlh, len);
           nlh = mnl_nlmsg_next(nlh, &len)) {
        if (nlh->nlmsg_type == NLMSG_ERROR) {  // a verdict the kernel refused
          auto* err = static_cast<nlmsgerr*>(mnl_nlmsg_get_payload(nlh));
          if (err->error != 0) ++counts_.errors;
          continue;
        }
        nlattr* attr[NFQA_MAX + 1] = {};
        if (nfq_nlmsg_parse(nlh, attr) < 0 || attr[NFQA_PACKET_HDR] == nullptr) continue;
        auto* ph = static_cast<nfqnl_msg_packet_hdr*>(mnl_attr_get_payload(attr[NFQA_PACKET_HDR]));
        const uint32_t id = ntohl(ph->packet_id);
        ++counts_.seen;
        if (loss_ > 0 && uniform_(rng_) < loss_) {
          PutVerdict(NFQNL_MSG_VERDICT, id, NF_DROP);
          ++counts_.dropped;
        } else {
          held_.push_back({id, now + delay_ns_});
          counts_.max_held = std::max<uint64_t>(counts_.max_held, held_.size());
        }
      }
    }
    return true;
  }

  // Accepts every held packet due by `now` (all of them if `all`), in arrival order, after the
  // drop verdicts collected so far (a batch verdict covers every lower id still queued).
  bool Release(int64_t now, bool all) {
    uint32_t last = 0;
    size_t n = 0;
    while (!held_.empty() && (all || held_.front().due_ns <= now)) {
      const int64_t late = std::max<int64_t>(0, now - held_.front().due_ns);
      if (!all) {
        ++counts_.on_time;
        counts_.late_sum_ns += late;
        counts_.late_max_ns = std::max(counts_.late_max_ns, late);
      }
      last = held_.front().id;
      held_.pop_front();
      ++n;
    }
    if (n > 0) {
      PutVerdict(NFQNL_MSG_VERDICT_BATCH, last, NF_ACCEPT);
      counts_.accepted += n;
    }
    return Flush();
  }

  // Nanoseconds until the next release, or -1 when nothing is held.
  int64_t NextDueIn(int64_t now) const {
    return held_.empty() ? -1 : std::max<int64_t>(0, held_.front().due_ns - now);
  }

  const Counts& counts() const { return counts_; }

 private:
  // Appends a verdict (type NFQNL_MSG_VERDICT: packet `id`; NFQNL_MSG_VERDICT_BATCH: every
  // queued packet up to `id`) to the ones Flush sends.
  void PutVerdict(int type, uint32_t id, int verdict) {
    if (wlen_ + 256 > sizeof(wbuf_)) Flush();
    nlmsghdr* nlh = nfq_nlmsg_put(wbuf_ + wlen_, type, queue_);
    nfq_nlmsg_verdict_put(nlh, id, verdict);
    wlen_ += nlh->nlmsg_len;
  }

  // Sends the collected verdicts (several netlink messages, handled by the kernel in order).
  bool Flush() {
    if (wlen_ == 0) return true;
    const ssize_t n = mnl_socket_sendto(nl_, wbuf_, wlen_);
    wlen_ = 0;
    if (n < 0) {
      std::fprintf(stderr, "nfq_netem: verdicts on queue %d: %s\n", queue_, strerror(errno));
      return false;
    }
    return true;
  }

  mnl_socket* const nl_;
  const int queue_;
  const int64_t delay_ns_;
  const double loss_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  const size_t limit_;
  std::deque<Held> held_;  // arrival order = due order (one fixed delay)
  Counts counts_;
  char rbuf_[1 << 18];
  char wbuf_[1 << 16];
  size_t wlen_ = 0;
};

// The kernel's line for this queue in /proc/net/netfilter/nfnetlink_queue: "queue_dropped
// user_dropped" (packets over --limit, packets it could not hand to this process).
std::string KernelDrops(int queue) {
  std::ifstream in("/proc/net/netfilter/nfnetlink_queue");
  unsigned q, portid, total, mode, range, qdropped, udropped;
  std::string line;
  while (std::getline(in, line)) {
    if (std::sscanf(line.c_str(), "%u %u %u %u %u %u %u", &q, &portid, &total, &mode, &range,
                    &qdropped, &udropped) == 7 &&
        static_cast<int>(q) == queue) {
      return std::to_string(qdropped) + " over the limit, " + std::to_string(udropped) +
             " undeliverable";
    }
  }
  return "unknown";
}

// Runs `iptables -w -t TABLE OP CHAIN -i|-o DEV -j NFQUEUE --queue-num QUEUE` for `direction`
// (OP -A adds the rule, -D deletes it); prints why and returns false on failure.
bool QueueRule(const char* op, const std::string& direction, const std::string& dev, int queue) {
  const bool in = direction == "ingress";
  std::vector<std::string> words = {"iptables", "-w", "-t", in ? "raw" : "filter", op,
                                    in ? "PREROUTING" : "OUTPUT", in ? "-i" : "-o", dev,
                                    "-j", "NFQUEUE", "--queue-num", std::to_string(queue)};
  std::vector<char*> argv;
  std::string line;
  for (auto& w : words) {
    argv.push_back(w.data());
    line += (line.empty() ? "" : " ") + w;
  }
  argv.push_back(nullptr);
  pid_t pid;
  int status = 0;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0 ||
      waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr,
                 "nfq_netem: `%s` failed (status %d; is iptables installed? "
                 "deploy/install-deps.sh)\n", line.c_str(), status);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "nfq_netem");
  const int queue = absl::GetFlag(FLAGS_queue);
  const double delay_ms = absl::GetFlag(FLAGS_delay_ms);
  const double loss = absl::GetFlag(FLAGS_loss);
  const int limit = absl::GetFlag(FLAGS_limit);
  const std::string direction = absl::GetFlag(FLAGS_direction);
  if (queue < 0 || queue > 65535 || delay_ms < 0 || loss < 0 || loss > 1 || limit < 1 ||
      (direction != "ingress" && direction != "egress")) {
    std::fprintf(stderr,
                 "nfq_netem: bad flags: --queue=%d (0..65535) --delay_ms=%g (>= 0) --loss=%g "
                 "(0..1) --limit=%d (>= 1) --direction=%s (ingress or egress)\n", queue, delay_ms,
                 loss, limit, direction.c_str());
    return 1;
  }
  // SIGTERM/SIGINT are blocked except inside ppoll, so the stop flag is only ever seen there.
  sigset_t block, waitmask;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  sigprocmask(SIG_BLOCK, &block, &waitmask);
  sigdelset(&waitmask, SIGTERM);
  sigdelset(&waitmask, SIGINT);
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  prctl(PR_SET_TIMERSLACK, 1000UL);  // wake within ~1 us of a release, not the default 50 us

  mnl_socket* nl = mnl_socket_open(NETLINK_NETFILTER);
  if (nl == nullptr || mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
    std::fprintf(stderr, "nfq_netem: netlink socket: %s (needs root / CAP_NET_ADMIN)\n",
                 strerror(errno));
    return 1;
  }
  const int fd = mnl_socket_get_fd(nl);
  const int rcvbuf = 16 << 20, one = 1;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
  setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof(one));

  Netem netem(nl, queue, static_cast<int64_t>(delay_ms * 1e6), loss, absl::GetFlag(FLAGS_seed),
              static_cast<size_t>(limit));
  if (!netem.Configure("bind", [](nlmsghdr* nlh, const Netem&) {
        nfq_nlmsg_cfg_put_cmd(nlh, AF_INET, NFQNL_CFG_CMD_BIND);
      }) ||
      !netem.Configure("copy mode", [](nlmsghdr* nlh, const Netem&) {
        nfq_nlmsg_cfg_put_params(nlh, NFQNL_COPY_META, 0);
      }) ||
      !netem.Configure("queue length", [](nlmsghdr* nlh, const Netem& n) {
        nfq_nlmsg_cfg_put_qmaxlen(nlh, static_cast<uint32_t>(n.limit()));
      })) {
    return 1;
  }
  const std::string dev = absl::GetFlag(FLAGS_dev);
  if (!dev.empty() && !QueueRule("-A", direction, dev, queue)) return 1;
  std::fprintf(stderr, "nfq_netem: ready: queue %d%s%s%s, delay %g ms, loss %g, limit %d\n", queue,
               dev.empty() ? "" : " for packets ", dev.empty() ? "" : direction.c_str(),
               dev.empty() ? "" : (" on " + dev).c_str(), delay_ms, loss, limit);

  bool ok = true;
  while (ok && !g_stop) {
    const int64_t wait = netem.NextDueIn(NowNs());
    timespec ts = {static_cast<time_t>(wait / 1000000000), static_cast<long>(wait % 1000000000)};
    pollfd pfd = {fd, POLLIN, 0};
    const int r = ppoll(&pfd, 1, wait < 0 ? nullptr : &ts, &waitmask);
    if (r < 0 && errno != EINTR) {
      std::fprintf(stderr, "nfq_netem: ppoll: %s\n", strerror(errno));
      ok = false;
      break;
    }
    if (r > 0) ok = netem.ReadAll();
    ok = ok && netem.Release(NowNs(), false);
  }
  // Stop: nothing new gets queued once the rule is gone; release what is held, then unbind.
  if (!dev.empty()) QueueRule("-D", direction, dev, queue);
  netem.ReadAll();
  netem.Release(NowNs(), true);
  const std::string kernel = KernelDrops(queue);
  netem.Configure("unbind", [](nlmsghdr* nlh, const Netem&) {
    nfq_nlmsg_cfg_put_cmd(nlh, AF_INET, NFQNL_CFG_CMD_UNBIND);
  });
  mnl_socket_close(nl);
  const Counts& c = netem.counts();
  std::fprintf(stderr,
               "nfq_netem: queue %d: %" PRIu64 " packets, %" PRIu64 " delayed, %" PRIu64
               " dropped (%.2f%%), kernel drops: %s, at most %" PRIu64
               " held, release late by %.0f us mean %.0f us max, %" PRIu64 " netlink errors\n",
               queue, c.seen, c.accepted, c.dropped, c.seen ? 100.0 * c.dropped / c.seen : 0.0,
               kernel.c_str(), c.max_held,
               c.on_time ? c.late_sum_ns / 1e3 / c.on_time : 0.0, c.late_max_ns / 1e3,
               c.errors);
  return ok ? 0 : 1;
}
