// Script jobs (issue 23): a user's PyTorch script instead of ember-worker. Each rank is
// `<worker.python> -u <worker.script> <worker.args...>` in the job directory with torchrun's
// environment (runtime/job/torch_env.h), as the user spec_policy.h's ScriptIdentityFor decides.
//
// Rendezvous: the daemon that runs an attempt's rank 0 starts a TCPStore-protocol listener for
// that attempt alone (a fresh port, keys under jobs/<job>/attempt/<n>/torch/ of the hosted store,
// or of a private in-memory backend when this daemon hosts none) and publishes "host:port" under
// jobs/<job>/attempt/<n>/torch_master; every rank gets it as MASTER_ADDR/MASTER_PORT. The listener
// is shut down when the node's ranks of the attempt have all ended, before a next attempt can be
// placed on their devices, so a stale rank of attempt n finds its MASTER_PORT closed (connection
// refused), and a port is never handed to two attempts of one job. docs/architecture.md "Script
// jobs".
#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status_macros.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/process.h"
#include "runtime/job/keys.h"
#include "runtime/job/torch_env.h"
#include "runtime/jobspec/spec.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

namespace {

// Replaces `name` in `env` (or appends it): the environment holds each name once, so that C's
// getenv (first match) and Python's os.environ (last match) agree.
void SetEnv(std::vector<std::pair<std::string, std::string>>* env, const std::string& name,
            const std::string& value) {
  for (auto& [k, v] : *env) {
    if (k == name) {
      v = value;
      return;
    }
  }
  env->push_back({name, value});
}

}  // namespace

// Gloo binds the address its host name resolves to unless GLOO_SOCKET_IFNAME names an interface;
// on Debian that is 127.0.1.1, and gloo falls back to loopback: peers on other nodes cannot
// connect. The ranks get the interface of this node's advertised address (the one other nodes
// reach it at, as EMBER_COMM_HOST for built-in workers); "" for a loopback, wildcard or unknown
// address, where gloo's default is right (one node) or nothing better is known.
std::string GlooInterfaceOf(const std::string& comm_host) {
  if (comm_host.empty() || absl::StartsWith(comm_host, "127.")) return "";
  return InterfaceOfAddress(comm_host);
}

absl::StatusOr<Daemon::Impl::ScriptLaunch> Daemon::Impl::PrepareScript(
    const Job& job, const jobs::v1::NodeAssignment& mine, const std::string& dir) {
  const int n = job.attempts(job.attempts_size() - 1).number();
  ScriptLaunch launch;
  ASSIGN_OR_RETURN(launch.identity,
                   ScriptIdentityFor(::geteuid(), opts.script_user, opts.allow_root_scripts));
  // The job directory, checkpoints/ and flight/ were made the script user's by MakeJobDirs
  // (supervise.cc); logs/ and uploads/ stay the daemon's.
  const std::string key = absl::StrCat(job.id(), "#", n);
  if (mine.first_rank() != 0) {  // another node runs rank 0 and its listener
    auto master = store->Get(job::keys::TorchMaster(job.id(), n));
    if (!master.ok()) {
      return absl::UnavailableError("the attempt's TCPStore listener is not published yet");
    }
    std::vector<std::string> hp = absl::StrSplit(*master, absl::MaxSplits(':', 1));
    if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &launch.master_port)) {
      return absl::InternalError(absl::StrCat("bad torch_master '", *master, "'"));
    }
    launch.master_host = hp[0];
    return launch;
  }
  ASSIGN_OR_RETURN(const std::string host,
                   ScriptMasterAddr(CommHostOf(advertise), advertise,
                                    job.attempts(job.attempts_size() - 1).assignment().nodes_size()));
  {
    absl::MutexLock l(&torch_mu);
    auto it = torch_stores.find(key);
    if (it == torch_stores.end()) {
      store::Backend* backend = nullptr;
      if (hosted_store) {
        backend = hosted_store->backend();
      } else {
        if (!torch_backend) {
          ASSIGN_OR_RETURN(torch_backend, store::NewMemoryBackend({}, nullptr));
        }
        backend = torch_backend.get();
      }
      std::set<int>& used = torch_ports[job.id()];
      std::vector<std::unique_ptr<store::TcpStoreServer>> unwanted;  // closed after the choice
      std::unique_ptr<store::TcpStoreServer> server;
      store::TcpStoreOptions to;
      to.key_prefix = job::keys::TorchStore(job.id(), n);
      // The attempt's own budget (parked WAITs included), far below the hosted store's: what a
      // script (or anyone reaching its MASTER_PORT) can make this listener hold.
      to.max_buffered_bytes = size_t{64} << 20;
      for (int tries = 0; tries < 8 && !server; ++tries) {
        ASSIGN_OR_RETURN(auto s, store::TcpStoreServer::Start(host, 0, backend, to));
        if (used.count(s->port())) unwanted.push_back(std::move(s));  // an earlier attempt's
        else server = std::move(s);
      }
      if (!server) return absl::UnavailableError("no fresh port for the attempt's TCPStore");
      used.insert(server->port());
      it = torch_stores.emplace(key, std::move(server)).first;
    }
    launch.master_host = host;
    launch.master_port = it->second->port();
  }
  RETURN_IF_ERROR(store->Set(job::keys::TorchMaster(job.id(), n),
                             absl::StrCat(launch.master_host, ":", launch.master_port)));
  spdlog::info("job {} attempt {}: TCPStore listener {}:{} (MASTER_ADDR/MASTER_PORT)", job.id(), n,
               launch.master_host, launch.master_port);
  return launch;
}

void Daemon::Impl::ScriptSpawnOptions(const Job& job, const jobs::v1::NodeAssignment& mine,
                                      const ScriptLaunch& launch, const ember::job::WorkerEnv& we,
                                      SpawnOptions* so) const {
  const spec::v1::WorkerConfig& w = job.spec().worker();
  // Relative scripts were uploaded; the rank starts in the job directory.
  const std::string script = w.script()[0] == '/' ? w.script() : "uploads/" + w.script();
  so->argv = {w.python(), "-u", script};
  so->argv.insert(so->argv.end(), w.args().begin(), w.args().end());
  so->switch_user = launch.identity.switch_user;
  so->uid = launch.identity.uid;
  so->gid = launch.identity.gid;

  ember::job::TorchEnv te;
  te.rank = we.rank;
  te.local_rank = we.local_rank;
  te.world_size = we.world_size;
  te.local_world_size = we.local_world_size;
  te.group_rank = mine.node_rank();
  te.group_world_size = job.attempts(job.attempts_size() - 1).assignment().nodes_size();
  te.master_addr = launch.master_host;
  te.master_port = launch.master_port;
  te.restart_count = we.attempt;
  te.max_restarts = job.spec().max_restarts();
  te.run_id = job.id();
  std::vector<std::string> cuda;
  for (const auto& d : mine.devices()) {
    if (DeviceOfKind(d, "cuda")) cuda.push_back(d.substr(d.find(':') + 1));
  }
  te.cuda = !cuda.empty();
  te.cuda_visible_devices = absl::StrJoin(cuda, ",");
  te.flight_dir = we.fr_dump_dir;
  te.gloo_socket_ifname = GlooInterfaceOf(CommHostOf(advertise));

  // Ember's own variables identify the rank (EMBER_JOB_ID finds a job's processes), but a script
  // gets no store address, token or TLS files: it talks to the cluster only through MASTER_PORT.
  ember::job::WorkerEnv ident = we;
  ident.store_addr.clear();
  ident.auth_token_file.clear();
  ident.tls = {};
  std::vector<std::pair<std::string, std::string>> env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}};
  for (const char* pass : {"HOME", "LANG", "TZ", "LD_LIBRARY_PATH", "TMPDIR"}) {
    if (const char* v = getenv(pass)) SetEnv(&env, pass, v);
  }
  if (launch.identity.switch_user) SetEnv(&env, "HOME", we.job_dir);  // not root's home
  for (auto& [k, v] : ident.ToEnv()) {
    if (k != ember::job::kEnvStoreAddr) SetEnv(&env, k, v);
  }
  for (auto& [k, v] : te.ToEnv()) SetEnv(&env, k, v);
  for (const auto& [k, v] : opts.worker_env) SetEnv(&env, k, v);
  for (const auto& [k, v] : w.env()) SetEnv(&env, k, v);  // CheckScriptEnv: no contract names
  so->env = std::move(env);
}

void Daemon::Impl::StopTorchStore(const std::string& job, int attempt) {
  std::unique_ptr<store::TcpStoreServer> s;
  {
    absl::MutexLock l(&torch_mu);
    auto it = torch_stores.find(absl::StrCat(job, "#", attempt));
    if (it == torch_stores.end()) return;
    s = std::move(it->second);
    torch_stores.erase(it);
  }
  s->Shutdown();  // joins its connection threads: without the lock
  spdlog::info("job {} attempt {}: TCPStore listener closed", job, attempt);
}

void Daemon::Impl::StopTorchStores() {
  std::map<std::string, std::unique_ptr<store::TcpStoreServer>> all;
  {
    absl::MutexLock l(&torch_mu);
    all.swap(torch_stores);
  }
  for (auto& [k, s] : all) s->Shutdown();
}

}  // namespace ember::daemon
