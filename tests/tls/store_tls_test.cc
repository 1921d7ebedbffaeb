// The store over TLS and mTLS, in process, with certificates made at test time by make_certs.sh
// (openssl CLI): what works, what is refused, and that mismatches fail fast with a clear error.
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/wire_probe.h"
#include "runtime/base/auth.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"

namespace ember::store {
namespace {

// The PKI of make_certs.sh, made once per test binary.
const std::string& CertDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string d = absl::StrCat(tmp ? tmp : "/tmp", "/pki");
    std::string cmd = absl::StrCat("tests/tls/make_certs.sh ", d);
    REQUIRE(std::system(cmd.c_str()) == 0);
    return d;
  }();
  return dir;
}

std::string Pem(const std::string& name) { return absl::StrCat(CertDir(), "/", name); }

base::TlsOptions ServerTls(bool mutual) {
  base::TlsOptions t;
  t.cert_file = Pem("node.crt");
  t.key_file = Pem("node.key");
  if (mutual) t.ca_file = Pem("ca.crt");
  return t;
}

std::unique_ptr<StoreServer> StartStore(const base::TlsOptions* tls) {
  StoreServerOptions so;
  so.auth_token = "tls-test-token-0123456789";
  if (tls != nullptr) {
    auto creds = base::MakeServerCredentials(*tls);
    REQUIRE(creds.ok());
    so.credentials = *creds;
  }
  auto s = StoreServer::Start(so);
  REQUIRE(s.ok());
  return std::move(*s);
}

// Connects with the CA (when ca) and the named client certificate ("" = none).
absl::StatusOr<Client> Dial(const StoreServer& s, bool tls, const std::string& cert = "",
                            absl::Duration timeout = absl::Seconds(20),
                            const std::string& ca = "ca") {
  ClientOptions co;
  co.address = s.address();
  co.auth_token = "tls-test-token-0123456789";
  co.connect_timeout = timeout;
  if (tls) {
    base::TlsOptions t;
    t.ca_file = Pem(ca + ".crt");
    if (!cert.empty()) {
      t.cert_file = Pem(cert + ".crt");
      t.key_file = Pem(cert + ".key");
    }
    auto creds = base::MakeChannelCredentials(t);
    REQUIRE(creds.ok());
    co.credentials = *creds;
  }
  return Client::Connect(co);
}

TEST_CASE("TLS store: a client trusting the CA works over gRPC; the plaintext fast path is off") {
  base::TlsOptions tls = ServerTls(false);
  auto server = StartStore(&tls);
  CHECK(server->fast_port() == 0);
  auto c = Dial(*server, true);
  REQUIRE(c.ok());
  REQUIRE(c->Set("k", "v").ok());
  auto v = c->Get("k");
  REQUIRE(v.ok());
  CHECK(*v == "v");
  CHECK(base::ProbeWireProtocol(server->address()) == base::WireProtocol::kTls);
  // A client that does not trust the store's CA is refused, with the handshake hint.
  auto untrusting = Dial(*server, true, "", absl::Seconds(3), "rogue-ca");
  REQUIRE(!untrusting.ok());
  INFO(untrusting.status().ToString());
  CHECK(absl::IsUnavailable(untrusting.status()));
  CHECK(absl::StrContains(untrusting.status().message(), "this client trusts its CA"));
}

TEST_CASE("a plaintext client against a TLS store fails fast with FAILED_PRECONDITION") {
  base::TlsOptions tls = ServerTls(false);
  auto server = StartStore(&tls);
  absl::Time start = absl::Now();
  auto c = Dial(*server, false);
  REQUIRE(!c.ok());
  INFO(c.status().ToString());
  CHECK(absl::IsFailedPrecondition(c.status()));
  CHECK(absl::StrContains(c.status().message(), "serves TLS but this client connects without TLS"));
  CHECK(absl::StrContains(c.status().message(), server->address()));
  CHECK(absl::Now() - start < absl::Seconds(10));  // not the 20 s connect timeout
}

TEST_CASE("a TLS client never falls back to plaintext: against a plaintext store it fails") {
  auto server = StartStore(nullptr);
  REQUIRE(server->fast_port() > 0);  // offered, and must not be used by a TLS client
  CHECK(base::ProbeWireProtocol(server->address()) == base::WireProtocol::kPlaintext);
  auto c = Dial(*server, true);
  REQUIRE(!c.ok());
  INFO(c.status().ToString());
  CHECK(absl::IsFailedPrecondition(c.status()));
  CHECK(absl::StrContains(c.status().message(), "serves plaintext (no TLS)"));
}

TEST_CASE("mTLS store: accepts the CA's client certificates, refuses none or another CA's") {
  base::TlsOptions tls = ServerTls(true);
  REQUIRE(tls.mutual());
  auto server = StartStore(&tls);
  CHECK(server->fast_port() == 0);
  for (const char* cert : {"node", "client"}) {
    auto c = Dial(*server, true, cert);
    INFO(cert);
    REQUIRE(c.ok());
    REQUIRE(c->Set(absl::StrCat("by/", cert), "1").ok());
  }
  for (const char* cert : {"", "rogue"}) {
    INFO("client certificate: " << (*cert ? cert : "none"));
    auto c = Dial(*server, true, cert, absl::Seconds(3));
    REQUIRE(!c.ok());
    INFO(c.status().ToString());
    CHECK(absl::IsUnavailable(c.status()));  // both speak TLS: no mismatch, a refused handshake
    CHECK(absl::StrContains(c.status().message(), "requires client certificates (mTLS)"));
  }
  auto plain = Dial(*server, false);
  REQUIRE(!plain.ok());
  CHECK(absl::IsFailedPrecondition(plain.status()));
  // With verify_clients off the same CA only serves TLS: no client certificate needed.
  tls.verify_clients = false;
  REQUIRE(!tls.mutual());
  auto relaxed = StartStore(&tls);
  REQUIRE(Dial(*relaxed, true).ok());
}

TEST_CASE("the wire probe cannot tell without a server: no mismatch is claimed") {
  CHECK(base::ProbeWireProtocol("127.0.0.1:1") == base::WireProtocol::kUnknown);  // refused
  CHECK(base::ProbeWireProtocol("unix:/tmp/x") == base::WireProtocol::kUnknown);
  CHECK(!base::DiagnoseTls(base::WireProtocol::kUnknown, true).mismatch);
  CHECK(base::DiagnoseTls(base::WireProtocol::kUnknown, false).text.empty());
}

TEST_CASE("TLS options are checked: a certificate needs its key, a server needs a certificate") {
  base::TlsOptions only_ca;
  only_ca.ca_file = Pem("ca.crt");
  auto s = base::MakeServerCredentials(only_ca);
  REQUIRE(!s.ok());
  CHECK(absl::StrContains(s.status().message(), "--tls-cert and --tls-key"));
  base::TlsOptions no_key = only_ca;
  no_key.cert_file = Pem("client.crt");
  REQUIRE(!base::MakeChannelCredentials(no_key).ok());
  base::TlsOptions missing = ServerTls(false);
  missing.key_file = Pem("no-such.key");
  auto m = base::MakeServerCredentials(missing);
  REQUIRE(!m.ok());
  CHECK(absl::StrContains(m.status().message(), "no-such.key"));
}

}  // namespace
}  // namespace ember::store
