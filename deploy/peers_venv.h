// Where the current PyTorch peers live: the virtual environment deploy/peers-venv.sh creates (torch
// 2.15.0, transformers 5.25.0), and which interpreter a benchmark's PyTorch peer runs under. The
// shell side of the same rule is `deploy/peers-venv.sh --python`.
//
// Header-only; the functions read the environment and the file system on each call and are
// thread-safe as long as nobody calls setenv concurrently. PeerTorchVersion runs the interpreter
// (popen, a few seconds for torch 2.15's import); callers cache its answer.
#ifndef EMBER_DEPLOY_PEERS_VENV_H_
#define EMBER_DEPLOY_PEERS_VENV_H_

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace ember::deploy {

inline constexpr char kDefaultPeersVenv[] = "/opt/ember-peers/torch-2.15";
inline constexpr char kDebianPython[] = "/usr/bin/python3";  // Debian's python3-torch 1.13

// $EMBER_PEERS_VENV, else kDefaultPeersVenv.
inline std::string PeersVenv() {
  const char* v = std::getenv("EMBER_PEERS_VENV");
  return v != nullptr && *v != '\0' ? v : kDefaultPeersVenv;
}

// True when deploy/peers-venv.sh finished there (its stamp is written last).
inline bool PeersVenvReady() {
  const std::string v = PeersVenv();
  return access((v + "/.ember-peers-stamp").c_str(), R_OK) == 0 &&
         access((v + "/bin/python").c_str(), X_OK) == 0;
}

// The venv's interpreter (whether or not it exists; see PeersVenvReady).
inline std::string PeersVenvPython() { return PeersVenv() + "/bin/python"; }

// The interpreter a PyTorch peer runs under: $EMBER_PEER_PYTHON if set, else the venv's python
// when the venv is ready, else Debian's /usr/bin/python3.
inline std::string PeerPython() {
  const char* p = std::getenv("EMBER_PEER_PYTHON");
  if (p != nullptr && *p != '\0') return p;
  return PeersVenvReady() ? PeersVenvPython() : kDebianPython;
}

// What a test that needs the venv prints when it is missing.
inline std::string PeersVenvMissing() {
  return "the torch 2.15 peers venv is missing at " + PeersVenv() +
         ": run deploy/peers-venv.sh (deploy/install-deps.sh runs it), or set EMBER_PEERS_VENV";
}

// For the benchmarks whose peer must be current PyTorch (issue 30): PeerPython() without the
// fallback to Debian's torch 1.13. $EMBER_PEER_PYTHON if set (an explicit choice, named in every
// row through PeerTorchVersion), else the venv's python when the venv is ready, else "" with
// *why_missing = PeersVenvMissing() (the benchmark then reports its peer rows not measured).
inline std::string CurrentTorchPeerPython(std::string* why_missing) {
  const char* p = std::getenv("EMBER_PEER_PYTHON");
  if (p != nullptr && *p != '\0') return p;
  if (PeersVenvReady()) return PeersVenvPython();
  if (why_missing != nullptr) *why_missing = PeersVenvMissing();
  return "";
}

// torch.__version__ under `python` ("2.15.0+cu132"), or "" when it has no importable torch.
inline std::string PeerTorchVersion(const std::string& python) {
  std::string version;
  const std::string cmd = python + " -c 'import torch; print(torch.__version__)' 2>/dev/null";
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[128];
    while (fgets(buf, sizeof(buf), p)) version += buf;
    if (pclose(p) != 0) version.clear();
  }
  while (!version.empty() && (version.back() == '\n' || version.back() == ' ')) version.pop_back();
  if (version.size() > 64 || version.find('\n') != std::string::npos) version.clear();
  return version;
}

}  // namespace ember::deploy

#endif  // EMBER_DEPLOY_PEERS_VENV_H_
