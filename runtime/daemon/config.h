// emberd's configuration: proto/daemon_config.proto declares every setting once (name, type,
// default, help). A YAML file sets them by name (parsed by the job spec's YAML -> proto code,
// runtime/jobspec/yaml_proto.h), command-line flags of the same names override the file, and
// ToDaemonOptions checks the result and turns it into DaemonOptions. Thread-compatible.
//
//   # /etc/ember/emberd.yaml
//   host_store: true
//   auth_token_file: /etc/ember/token
//   work_root: /var/lib/ember/jobs
//   worker_binary: /usr/local/bin/ember-worker
//
//   EmberdConfig cfg, flags;
//   ASSIGN_OR_RETURN(std::vector<std::string> rest, ParseConfigFlags(args, &flags));
//   RETURN_IF_ERROR(LoadEmberdConfig(path, &cfg));
//   OverrideConfig(flags, &cfg);
//   ASSIGN_OR_RETURN(DaemonOptions o, ToDaemonOptions(cfg));
#ifndef EMBER_RUNTIME_DAEMON_CONFIG_H_
#define EMBER_RUNTIME_DAEMON_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/daemon_config.pb.h"
#include "runtime/daemon/daemon.h"

namespace ember::daemon {

using EmberdConfig = v1::DaemonConfig;

// Reads a YAML config file into *cfg: the keys it names replace cfg's values. INVALID_ARGUMENT
// naming the key for unknown keys, wrong types and the removed cgroup_root; NOT_FOUND naming the
// file.
absl::Status LoadEmberdConfig(const std::string& path, EmberdConfig* cfg);

// Takes the settings out of a command line (args[0] is the program): --NAME=VALUE or --NAME VALUE,
// NAME a DaemonConfig field spelled with underscores or dashes (one leading dash is enough); a
// bool also takes --NAME (true), --noNAME and --no_NAME (false; --no_NAME=B is NAME=!B) but never
// a separate value; a list is comma-separated. Sets them in *flags and returns every other argument, in order, for
// absl flag parsing. INVALID_ARGUMENT naming the flag for a bad or missing value.
absl::StatusOr<std::vector<std::string>> ParseConfigFlags(const std::vector<std::string>& args,
                                                          EmberdConfig* flags);

// The settings set in `overrides` replace those of *cfg (a list replaces the whole list).
void OverrideConfig(const EmberdConfig& overrides, EmberdConfig* cfg);

// "  --name=TYPE  help (default: X)" for every setting, for `emberd --help`.
std::string ConfigFlagsHelp();

// Reads the token file and the TLS files; INVALID_ARGUMENT when no token is configured and
// insecure_no_auth is off, TLS is half configured or a value is out of range; file errors name the
// file.
absl::StatusOr<DaemonOptions> ToDaemonOptions(const EmberdConfig& cfg);

// http_listen "auto": the API's host with its port + 1 (port 0 stays 0; [::] and [::1] become
// 0.0.0.0 and 127.0.0.1, the HTTP server being IPv4 only); other values as given.
// INVALID_ARGUMENT when auto meets a listen address without a port or another IPv6 host.
absl::StatusOr<std::string> HttpListenOf(const std::string& http_listen,
                                         const std::string& api_listen);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_CONFIG_H_
