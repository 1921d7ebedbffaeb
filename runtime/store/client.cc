// ember::store::Client and Pipeline: requests built from the calls, answers read back. The
// connection they share (queue, transports, reconnects) is client_connection.h.
#include "runtime/store/client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/store.pb.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/client_connection.h"
#include "runtime/store/client_grpc.h"
#include "runtime/store/client_retry.h"

namespace ember::store {

using client_internal::ToStatus;
using v1::Request;
using v1::Response;

namespace {

// Request builders and answer readers shared by the blocking, async and pipelined calls.
Request AddRequest(std::string full_key, int64_t delta) {
  Request req;
  req.mutable_add()->set_key(std::move(full_key));
  req.mutable_add()->set_delta(delta);
  return req;
}

absl::StatusOr<int64_t> AddAnswer(const Response& r) {
  RETURN_IF_ERROR(ToStatus(r));
  return r.add().value();
}

Request SetRequest(std::string full_key, absl::string_view value, int64_t lease) {
  Request req;
  req.mutable_set()->set_key(std::move(full_key));
  req.mutable_set()->set_value(std::string(value));
  req.mutable_set()->set_lease_id(lease);
  return req;
}

// Runs one request synchronously.
absl::StatusOr<Response> RunSync(Connection* conn, Request req, absl::Duration timeout) {
  Response out = conn->CallSync(std::move(req), timeout);
  RETURN_IF_ERROR(ToStatus(out));
  return out;
}

int64_t Ms(absl::Duration d) { return std::max<int64_t>(1, absl::ToInt64Milliseconds(d)); }

}  // namespace

bool IsFenced(const absl::Status& s) {
  return absl::IsFailedPrecondition(s) && absl::StrContains(s.message(), "write refused by fence");
}

absl::StatusOr<Client> Client::Connect(const ClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("store address is empty; pass host:port of ember-store");
  }
  auto conn = std::make_shared<Connection>(options);
  Client c(conn, "");
  // A cheap round trip proves the server is there and accepts our token.
  Request ping;
  ping.mutable_check()->add_keys("__ember_ping__");
  auto r = RunSync(conn.get(), ping, options.connect_timeout);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat("connecting to store at ", options.address, ": ",
                                     r.status().message()));
  }
  return c;
}

Client Client::WithPrefix(absl::string_view prefix) const {
  return Client(conn_, absl::StrCat(prefix_, prefix));
}
const std::string& Client::address() const { return conn_->options().address; }
std::string Client::Full(absl::string_view key) const { return absl::StrCat(prefix_, key); }
absl::Duration Client::Timeout(const CallOptions& o) const {
  return o.timeout > absl::ZeroDuration() ? o.timeout : conn_->options().default_timeout;
}

absl::Status Client::Set(absl::string_view key, absl::string_view value, CallOptions opts) {
  return SetWithLease(key, value, 0, opts);
}

absl::Status Client::SetWithLease(absl::string_view key, absl::string_view value, int64_t lease,
                                  CallOptions opts) {
  return RunSync(conn_.get(), SetRequest(Full(key), value, lease), Timeout(opts)).status();
}

absl::StatusOr<std::string> Client::Get(absl::string_view key, CallOptions opts) {
  Request req;
  absl::Duration t = Timeout(opts);
  req.mutable_get()->set_key(Full(key));
  req.mutable_get()->set_wait(opts.wait);
  req.mutable_get()->set_timeout_ms(Ms(t));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), t));
  if (!r.get().found()) return absl::NotFoundError(absl::StrCat("key '", Full(key), "' not found"));
  return std::move(*r.mutable_get()->mutable_value());
}

absl::StatusOr<int64_t> Client::Add(absl::string_view key, int64_t delta, CallOptions opts) {
  return AddAnswer(conn_->CallSync(AddRequest(Full(key), delta), Timeout(opts)));
}

absl::StatusOr<CompareSetResult> Client::CompareSet(absl::string_view key,
                                                    std::optional<std::string> expected,
                                                    absl::string_view desired, CallOptions opts) {
  Request req;
  auto* q = req.mutable_compare_set();
  q->set_key(Full(key));
  q->set_expect_absent(!expected.has_value());
  if (expected) q->set_expected(*expected);
  q->set_desired(std::string(desired));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return CompareSetResult{r.compare_set().swapped(), r.compare_set().exists(),
                          r.compare_set().current()};
}

absl::Status Client::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  Request req;
  for (const auto& k : keys) req.mutable_wait()->add_keys(Full(k));
  req.mutable_wait()->set_timeout_ms(Ms(timeout));
  return RunSync(conn_.get(), std::move(req), timeout).status();
}

absl::StatusOr<bool> Client::Check(const std::vector<std::string>& keys, CallOptions opts) {
  Request req;
  for (const auto& k : keys) req.mutable_check()->add_keys(Full(k));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.check().all_exist();
}

absl::StatusOr<bool> Client::Delete(absl::string_view key, CallOptions opts) {
  Request req;
  req.mutable_delete_()->set_key(Full(key));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.delete_().deleted();
}

absl::StatusOr<int64_t> Client::DeletePrefix(absl::string_view prefix, CallOptions opts) {
  Request req;
  req.mutable_delete_prefix()->set_prefix(Full(prefix));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.delete_prefix().deleted();
}

absl::StatusOr<int64_t> Client::NumKeys(absl::string_view prefix, CallOptions opts) {
  Request req;
  req.mutable_num_keys()->set_prefix(Full(prefix));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.num_keys().count();
}

absl::StatusOr<std::vector<std::optional<std::string>>> Client::MultiGet(
    const std::vector<std::string>& keys, CallOptions opts) {
  Request req;
  absl::Duration t = Timeout(opts);
  for (const auto& k : keys) req.mutable_multi_get()->add_keys(Full(k));
  req.mutable_multi_get()->set_wait(opts.wait);
  req.mutable_multi_get()->set_timeout_ms(Ms(t));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), t));
  std::vector<std::optional<std::string>> out(keys.size());
  const auto& m = r.multi_get();
  for (int i = 0; i < m.found_size() && i < static_cast<int>(out.size()); ++i) {
    if (m.found(i)) out[i] = m.values(i);
  }
  return out;
}

absl::Status Client::MultiSet(const std::vector<std::pair<std::string, std::string>>& kvs,
                              CallOptions opts) {
  Request req;
  for (const auto& [k, v] : kvs) {
    auto* kv = req.mutable_multi_set()->add_kvs();
    kv->set_key(Full(k));
    kv->set_value(v);
  }
  return RunSync(conn_.get(), std::move(req), Timeout(opts)).status();
}

absl::StatusOr<int64_t> Client::Append(absl::string_view key, absl::string_view value,
                                       CallOptions opts) {
  Request req;
  req.mutable_append()->set_key(Full(key));
  req.mutable_append()->set_value(std::string(value));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.append().new_size();
}

absl::StatusOr<std::vector<std::string>> Client::ListKeys(absl::string_view prefix,
                                                          CallOptions opts) {
  Request req;
  req.mutable_list_keys()->set_prefix(Full(prefix));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  std::vector<std::string> out;
  out.reserve(r.list_keys().keys_size());
  for (const auto& k : r.list_keys().keys()) out.push_back(k.substr(prefix_.size()));
  return out;
}

absl::StatusOr<int64_t> Client::GrantLease(absl::Duration ttl, CallOptions opts) {
  Request req;
  req.mutable_lease_grant()->set_ttl_ms(Ms(ttl));
  ASSIGN_OR_RETURN(Response r, RunSync(conn_.get(), std::move(req), Timeout(opts)));
  return r.lease_grant().lease_id();
}

absl::Status Client::RefreshLease(int64_t lease_id, CallOptions opts) {
  Request req;
  req.mutable_lease_refresh()->set_lease_id(lease_id);
  return RunSync(conn_.get(), std::move(req), Timeout(opts)).status();
}

absl::Status Client::RevokeLease(int64_t lease_id, CallOptions opts) {
  Request req;
  req.mutable_lease_revoke()->set_lease_id(lease_id);
  return RunSync(conn_.get(), std::move(req), Timeout(opts)).status();
}

absl::StatusOr<std::unique_ptr<Watch>> Client::WatchPrefix(
    absl::string_view prefix, std::function<void(const WatchEvent&)> on_event, bool send_initial,
    std::function<void(absl::Status)> on_end) {
  v1::WatchRequest req;
  req.set_prefix(Full(prefix));
  req.set_send_initial(send_initial);
  const absl::Duration timeout = conn_->options().connect_timeout;
  auto w = client_internal::StartWatch(conn_->stub(), conn_->options(), req, std::move(on_event),
                                       std::move(on_end), timeout);
  if (!w.ok()) {
    return absl::Status(w.status().code(),
                        absl::StrCat("watch of '", Full(prefix), "' at store ", address(),
                                     " (within ", absl::FormatDuration(timeout),
                                     "): ", w.status().message()));
  }
  return w;
}

absl::Status Client::Barrier(absl::string_view key, int n, absl::Duration timeout) {
  std::string arrived = absl::StrCat(key, "/arrived");
  std::string done = absl::StrCat(key, "/done");
  // One deadline for the whole barrier: each step gets what is left of it.
  const absl::Time deadline = absl::Now() + timeout;
  auto left = [deadline] { return std::max(absl::Milliseconds(1), deadline - absl::Now()); };
  ASSIGN_OR_RETURN(int64_t count, Add(arrived, 1, {.timeout = left()}));
  if (count == n) RETURN_IF_ERROR(Set(done, "1", {.timeout = left()}));
  absl::Status s = Wait({done}, left());
  if (absl::IsDeadlineExceeded(s)) {
    // Only for the message: a short look, so a silent store does not hold the caller much longer.
    auto now = Add(arrived, 0, {.timeout = absl::Milliseconds(100)});
    return absl::DeadlineExceededError(absl::StrCat(
        "barrier '", Full(key), "': only ", now.ok() ? absl::StrCat(*now) : "?", " of ", n,
        " participants arrived within ", absl::FormatDuration(timeout)));
  }
  return s;
}

void Client::SetAsync(absl::string_view key, absl::string_view value,
                      std::function<void(absl::Status)> done, CallOptions opts) {
  conn_->Call(SetRequest(Full(key), value, 0), Timeout(opts),
              [done = std::move(done)](Response r) { done(ToStatus(r)); });
}

void Client::GetAsync(absl::string_view key,
                      std::function<void(absl::StatusOr<std::string>)> done, CallOptions opts) {
  Request req;
  absl::Duration t = Timeout(opts);
  std::string full = Full(key);
  req.mutable_get()->set_key(full);
  req.mutable_get()->set_wait(opts.wait);
  req.mutable_get()->set_timeout_ms(Ms(t));
  conn_->Call(std::move(req), t, [done = std::move(done), full](Response r) {
    absl::Status s = ToStatus(r);
    if (!s.ok()) return done(s);
    if (!r.get().found()) {
      return done(absl::NotFoundError(absl::StrCat("key '", full, "' not found")));
    }
    done(std::move(*r.mutable_get()->mutable_value()));
  });
}

void Client::AddAsync(absl::string_view key, int64_t delta,
                      std::function<void(absl::StatusOr<int64_t>)> done, CallOptions opts) {
  conn_->Call(AddRequest(Full(key), delta), Timeout(opts),
              [done = std::move(done)](Response r) { done(AddAnswer(r)); });
}

Pipeline::Pipeline(const Client& client, int window)
    : client_(client), window_(std::max(1, window)), group_(std::make_shared<Group>()) {}

Pipeline::~Pipeline() { Drain().IgnoreError(); }

void Pipeline::Add(absl::string_view key, int64_t delta,
                   std::function<void(absl::StatusOr<int64_t>)> done, CallOptions opts) {
  Connection* conn = client_.conn_.get();
  conn->AwaitRoom(group_.get(), window_);
  conn->CallInGroup(group_, AddRequest(client_.Full(key), delta), client_.Timeout(opts),
                    [done = std::move(done)](Response r) {
                      absl::StatusOr<int64_t> v = AddAnswer(r);
                      absl::Status s = v.status();
                      if (done) done(std::move(v));
                      return s;
                    });
}

void Pipeline::Set(absl::string_view key, absl::string_view value,
                   std::function<void(absl::Status)> done, CallOptions opts) {
  Connection* conn = client_.conn_.get();
  conn->AwaitRoom(group_.get(), window_);
  conn->CallInGroup(group_, SetRequest(client_.Full(key), value, 0), client_.Timeout(opts),
                    [done = std::move(done)](Response r) {
                      absl::Status s = ToStatus(r);
                      if (done) done(s);
                      return s;
                    });
}

void Pipeline::Flush() { client_.conn_->Flush(); }

absl::Status Pipeline::Drain() { return client_.conn_->DrainGroup(group_.get()); }

}  // namespace ember::store
