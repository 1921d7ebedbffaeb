// EtcdClient: channels, auth token and the retry rule (see etcd_client.h).
#include "runtime/store/etcd_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"
#include "spdlog/spdlog.h"

namespace ember::store {
namespace {

constexpr absl::Duration kAttemptTimeout = absl::Seconds(5);

// The request certainly did not reach etcd's raft log: safe to send again whatever it is.
bool NotApplied(const grpc::Status& s) {
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  const std::string& m = s.error_message();
  return absl::StrContains(m, "failed to connect") || absl::StrContains(m, "no leader") ||
         absl::StrContains(m, "Connection refused") || absl::StrContains(m, "DNS resolution") ||
         absl::StrContains(m, "connections to all backends failing") ||
         absl::StrContains(m, "not capable");
}

// Worth another attempt (maybe on another member) if the call may be applied twice.
bool Transient(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:  // one attempt's deadline; the op's is checked apart
      return true;
    default:
      return false;
  }
}

absl::Status ToAbsl(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

absl::Duration EtcdClient::Backoff(int failures) {
  return std::min(absl::Milliseconds(20) * (1 << std::min(failures, 5)), absl::Milliseconds(500));
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdOptions& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("the etcd backend needs at least one endpoint "
                                      "(--etcd-endpoints=host:2379,...)");
  }
  if (options.user.empty() != options.password.empty()) {
    return absl::InvalidArgumentError("etcd auth needs both a user and a password");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> creds,
                   base::MakeChannelCredentials(options.tls));
  auto c = std::unique_ptr<EtcdClient>(new EtcdClient(options));
  c->endpoint_list_ = absl::StrJoin(options.endpoints, ",");
  for (const std::string& address : options.endpoints) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(INT32_MAX);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto ch = grpc::CreateCustomChannel(address, creds, args);
    Endpoint e;
    e.address = address;
    e.kv = etcdserverpb::KV::NewStub(ch);
    e.lease = etcdserverpb::Lease::NewStub(ch);
    e.watch = etcdserverpb::Watch::NewStub(ch);
    e.auth = etcdserverpb::Auth::NewStub(ch);
    c->endpoints_.push_back(std::move(e));
  }
  return c;
}

EtcdClient::Stubs EtcdClient::Current() {
  const Endpoint& e = endpoints_[current_.load() % endpoints_.size()];
  return Stubs{e.kv.get(), e.lease.get(), e.watch.get()};
}

void EtcdClient::Rotate() { current_.fetch_add(1); }

void EtcdClient::PrepareContext(grpc::ClientContext* ctx) {
  std::string token;
  {
    absl::MutexLock l(&mu_);
    token = token_;
  }
  if (token.empty() && !options_.user.empty()) {  // a stream after InvalidateToken()
    Authenticate(current_.load() % endpoints_.size(), absl::Now() + kAttemptTimeout)
        .IgnoreError();  // without a token the call fails UNAUTHENTICATED and says so
    absl::MutexLock l(&mu_);
    token = token_;
  }
  if (!token.empty()) ctx->AddMetadata("token", token);
}

bool EtcdClient::PrepareAsync(grpc::ClientContext* ctx, absl::Time deadline) {
  std::string token;
  if (!options_.user.empty()) {
    absl::MutexLock l(&mu_);
    if (token_.empty()) return false;
    token = token_;
  }
  ctx->set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + kAttemptTimeout)));
  if (!token.empty()) ctx->AddMetadata("token", token);
  return true;
}

void EtcdClient::InvalidateToken() {
  absl::MutexLock l(&mu_);
  token_.clear();
}

absl::Status EtcdClient::Authenticate(size_t index, absl::Time deadline) {
  if (options_.user.empty()) return absl::OkStatus();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + kAttemptTimeout)));
  etcdserverpb::AuthenticateRequest req;
  req.set_name(options_.user);
  req.set_password(options_.password);
  etcdserverpb::AuthenticateResponse resp;
  grpc::Status s = endpoints_[index].auth->Authenticate(&ctx, req, &resp);
  if (!s.ok()) return ToAbsl(s);
  absl::MutexLock l(&mu_);
  token_ = resp.token();
  return absl::OkStatus();
}

absl::Status EtcdClient::Call(const std::string& what, bool idempotent, absl::Time deadline,
                              const Attempt& attempt) {
  const absl::Time start = absl::Now();
  grpc::Status last;
  bool authenticated = false;
  for (int failures = 0;; ++failures) {
    const size_t index = current_.load() % endpoints_.size();
    {
      bool need_token;
      {
        absl::MutexLock l(&mu_);
        need_token = token_.empty() && !options_.user.empty();
      }
      if (need_token) {
        absl::Status a = Authenticate(index, deadline);
        if (!a.ok() && !absl::IsUnavailable(a) && !absl::IsDeadlineExceeded(a)) {
          return absl::Status(a.code(), absl::StrCat("etcd authentication as user '",
                                                     options_.user, "' failed: ", a.message()));
        }
      }
    }
    const Endpoint& e = endpoints_[index];
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + kAttemptTimeout)));
    PrepareContext(&ctx);
    last = attempt(Stubs{e.kv.get(), e.lease.get(), e.watch.get()}, &ctx);
    if (last.ok()) return absl::OkStatus();
    spdlog::debug("store: etcd {} on {} failed: {} {}", what, e.address, static_cast<int>(last.error_code()), last.error_message());
    if (last.error_code() == grpc::StatusCode::UNAUTHENTICATED && !options_.user.empty() &&
        !authenticated) {
      authenticated = true;  // the token expired: one fresh one, then the error stands
      {
        absl::MutexLock l(&mu_);
        token_.clear();
      }
      continue;
    }
    const bool retry = NotApplied(last) || (idempotent && Transient(last));
    if (!retry) {
      if (Transient(last)) {
        return absl::UnavailableError(absl::StrCat(
            "etcd (", e.address, ") failed ", what, " with an unknown outcome (it may or may "
            "not have been applied; read the key before retrying): ", last.error_message()));
      }
      return ToAbsl(last);
    }
    if (last.error_code() == grpc::StatusCode::UNAVAILABLE ||
        last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      Rotate();
    }
    const absl::Duration wait = Backoff(failures);
    if (absl::Now() + wait >= deadline) break;
    absl::SleepFor(wait);
  }
  return absl::UnavailableError(absl::StrCat(
      "etcd cluster [", endpoint_list_, "] did not complete ", what, " within ",
      absl::FormatDuration(absl::Now() - start), " (", last.error_message(),
      "); check that a majority of its members is up and reachable"));
}

std::vector<std::string> SplitEtcdEndpoints(absl::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view ep : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    ep = absl::StripAsciiWhitespace(ep);
    for (absl::string_view scheme : {"http://", "https://"}) absl::ConsumePrefix(&ep, scheme);
    out.emplace_back(ep);
  }
  return out;
}

absl::Status ParseEtcdUrl(absl::string_view url, EtcdOptions* options) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "etcd://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' is not an etcd URL; use etcd://host:port,host:port[/prefix]"));
  }
  // The prefix starts at the first '/' after the last endpoint's optional http(s)://.
  size_t from = rest.rfind(',');
  from = from == absl::string_view::npos ? 0 : from + 1;
  const size_t scheme = rest.find("://", from);
  const size_t slash = rest.find('/', scheme == absl::string_view::npos ? from : scheme + 3);
  const absl::string_view hosts = rest.substr(0, slash);
  std::string prefix(slash == absl::string_view::npos ? "" : rest.substr(slash));
  options->endpoints = SplitEtcdEndpoints(hosts);
  for (const std::string& ep : options->endpoints) {
    if (ep.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", url, "': endpoint '", ep,
                                                     "' has no port; use etcd://host:2379,..."));
    }
  }
  if (options->endpoints.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' names no etcd endpoint; use etcd://host:2379,host:2379"));
  }
  if (prefix.empty() || prefix == "/") prefix = "/ember/";
  if (prefix.back() != '/') prefix += '/';
  options->prefix = prefix;
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadEtcdPasswordFile(const std::string& file, absl::string_view what) {
  auto pw = base::ReadRegularFile(file, 4096);
  if (!pw.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", pw.status().message()));
  std::string password(absl::StripTrailingAsciiWhitespace(*pw));
  if (password.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", file, " is empty"));
  return password;
}

std::string DescribeEtcd(const EtcdOptions& options) {
  return absl::StrCat("etcd [", absl::StrJoin(options.endpoints, ","), "] prefix ", options.prefix,
                      options.user.empty() ? "" : absl::StrCat(", user ", options.user),
                      options.tls.enabled() ? ", tls" : "");
}

}  // namespace ember::store
