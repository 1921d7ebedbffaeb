// etcd's own lease and range-delete operations behind the store's requests: see etcd_ops.h.
#include "runtime/store/etcd_ops.h"

#include "absl/strings/str_cat.h"
#include "runtime/store/etcd_mapping.h"

namespace ember::store {
namespace {

using v1::Request;
using v1::Response;
namespace pb = etcdserverpb;
using etcd_mapping::OnEmptyState;
using etcd_mapping::SetStatus;

void LeaseGrant(const EtcdOpContext& c, const Request& req, Response* r) {
  Response checked = OnEmptyState(req, *c.options);
  if (checked.code() != 0) {
    SetError(r, static_cast<absl::StatusCode>(checked.code()), checked.message());
    return;
  }
  pb::LeaseGrantRequest q;
  q.set_ttl((req.lease_grant().ttl_ms() + 999) / 1000);
  pb::LeaseGrantResponse resp;
  absl::Status s = c.client->Call("a lease grant", false, c.deadline,
                                 [&](const EtcdClient::Stubs& st, grpc::ClientContext* c) {
                                   return st.lease->LeaseGrant(c, q, &resp);
                                 });
  if (s.ok() && !resp.error().empty()) s = absl::InternalError(resp.error());
  if (!s.ok()) return SetStatus(r, s);
  c.note_revision(resp.header().revision());
  r->mutable_lease_grant()->set_lease_id(resp.id());
  r->mutable_lease_grant()->set_ttl_ms(resp.ttl() * 1000);
}

void LeaseRefresh(const EtcdOpContext& c, const Request& req, Response* r) {
  pb::LeaseKeepAliveRequest q;
  q.set_id(req.lease_refresh().lease_id());
  pb::LeaseKeepAliveResponse resp;
  absl::Status s = c.client->Call(
      "a lease keep-alive", true, c.deadline,
      [&](const EtcdClient::Stubs& st, grpc::ClientContext* c) {
        auto stream = st.lease->LeaseKeepAlive(c);
        if (!stream->Write(q) || !stream->Read(&resp)) {
          c->TryCancel();
          grpc::Status f = stream->Finish();
          return f.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream ended")
                        : f;
        }
        stream->WritesDone();
        return stream->Finish();
      });
  if (!s.ok()) return SetStatus(r, s);
  if (resp.ttl() <= 0) {
    *r = OnEmptyState(req, *c.options);  // NOT_FOUND naming the lease
    r->set_id(req.id());
    return;
  }
  r->mutable_lease_refresh()->set_ttl_ms(resp.ttl() * 1000);
}

void LeaseRevoke(const EtcdOpContext& c, const Request& req, Response* r) {
  pb::LeaseTimeToLiveRequest tq;
  tq.set_id(req.lease_revoke().lease_id());
  tq.set_keys(true);
  pb::LeaseTimeToLiveResponse ttl;
  absl::Status s = c.client->Call("a lease lookup", true, c.deadline,
                                 [&](const EtcdClient::Stubs& st, grpc::ClientContext* c) {
                                   return st.lease->LeaseTimeToLive(c, tq, &ttl);
                                 });
  if (s.ok() && ttl.ttl() < 0) s = absl::NotFoundError("lease not found");
  pb::LeaseRevokeRequest q;
  q.set_id(req.lease_revoke().lease_id());
  pb::LeaseRevokeResponse resp;
  if (s.ok()) {
    s = c.client->Call("a lease revoke", true, c.deadline,
                      [&](const EtcdClient::Stubs& st, grpc::ClientContext* c) {
                        return st.lease->LeaseRevoke(c, q, &resp);
                      });
  }
  if (absl::IsNotFound(s)) {
    *r = OnEmptyState(req, *c.options);
    r->set_id(req.id());
    return;
  }
  if (!s.ok()) return SetStatus(r, s);
  c.note_revision(resp.header().revision());
  int64_t ours = 0;
  for (const std::string& k : ttl.keys()) ours += k.rfind(c.prefix, 0) == 0;
  r->mutable_lease_revoke()->set_deleted(ours);
}

void DeletePrefix(const EtcdOpContext& c, const Request& req, Response* r) {
  Response checked = OnEmptyState(req, *c.options);
  if (checked.code() != 0) {
    SetError(r, static_cast<absl::StatusCode>(checked.code()), checked.message());
    return;
  }
  const std::string p = c.prefix + req.delete_prefix().prefix();
  pb::DeleteRangeRequest q;
  q.set_key(p);
  q.set_range_end(PrefixRangeEnd(p));
  pb::DeleteRangeResponse resp;
  absl::Status s = c.client->Call(
      absl::StrCat("a delete of prefix '", req.delete_prefix().prefix(), "'"), false,
      c.deadline, [&](const EtcdClient::Stubs& st, grpc::ClientContext* c) {
        return st.kv->DeleteRange(c, q, &resp);
      });
  if (!s.ok()) return SetStatus(r, s);
  c.note_revision(resp.header().revision());
  r->mutable_delete_prefix()->set_deleted(resp.deleted());
}

}  // namespace

bool IsEtcdNativeOp(const Request& req) {
  return req.has_lease_grant() || req.has_lease_refresh() || req.has_lease_revoke() ||
         req.has_delete_prefix();
}

void RunEtcdNativeOp(const EtcdOpContext& c, const Request& req, Response* r) {
  switch (req.op_case()) {
    case Request::kLeaseGrant: return LeaseGrant(c, req, r);
    case Request::kLeaseRefresh: return LeaseRefresh(c, req, r);
    case Request::kLeaseRevoke: return LeaseRevoke(c, req, r);
    case Request::kDeletePrefix: return DeletePrefix(c, req, r);
    default: SetError(r, absl::StatusCode::kInternal, "not an etcd-native store operation");
  }
}

}  // namespace ember::store
