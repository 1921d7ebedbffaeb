// Telling TLS and plaintext gRPC servers apart, so that a client whose TLS settings do not match
// the server's can say so instead of "unreachable".
//
//   TlsDiagnosis d = DiagnoseTls(ProbeWireProtocol("10.0.0.1:29500"), /*client_uses_tls=*/false);
//   if (d.mismatch) return absl::FailedPreconditionError("store at 10.0.0.1:29500: " + d.text);
//
// The probe opens one TCP connection, sends the HTTP/2 client preface and reads the first bytes
// back: a plaintext gRPC server answers with an HTTP/2 SETTINGS frame; a TLS server answers with a
// TLS alert record or closes the connection without a byte. It blocks for at most `timeout`.
// Thread-safe (no shared state).
#ifndef EMBER_RUNTIME_BASE_WIRE_PROBE_H_
#define EMBER_RUNTIME_BASE_WIRE_PROBE_H_

#include <string>

#include "absl/time/time.h"

namespace ember::base {

enum class WireProtocol {
  kUnknown,    // no connection, no answer in time, or an answer that is neither
  kPlaintext,  // HTTP/2 without TLS (a gRPC server with insecure credentials)
  kTls,        // a TLS server (answered the preface with a TLS record, or hung up at once)
};

// `address` is host:port or [v6]:port; anything else (unix:, dns:///) is kUnknown.
WireProtocol ProbeWireProtocol(const std::string& address,
                               absl::Duration timeout = absl::Seconds(1));

// Why a client could not connect to a server speaking `server`, for the caller to prefix with
// what the server is ("store at HOST:PORT: "):
//   mismatch: one side speaks TLS and the other does not; retrying cannot help. text names the
//             side and the settings that fix it ("it serves TLS but this client ...").
//   both TLS: no mismatch; text lists the likely causes of a refused handshake (mTLS client
//             certificate, server name, CA).
//   otherwise: no mismatch, text empty.
struct TlsDiagnosis {
  bool mismatch = false;
  std::string text;
};
TlsDiagnosis DiagnoseTls(WireProtocol server, bool client_uses_tls);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_WIRE_PROBE_H_
