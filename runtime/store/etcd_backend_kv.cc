// EtcdKv: see etcd_backend_kv.h.
#include "runtime/store/etcd_backend_kv.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/etcd_mapping.h"
#include "runtime/store/idempotent.h"

namespace ember::store {

using v1::Request;
using v1::Response;
namespace pb = etcdserverpb;
using etcd_mapping::AssumeLease;
using etcd_mapping::CompareAndWrite;
using etcd_mapping::KeysOf;
using etcd_mapping::kMaxOpsPerTxn;
using etcd_mapping::OnEmptyState;
using etcd_mapping::PrefixOf;
using etcd_mapping::Recorder;
using etcd_mapping::SetStatus;

namespace {
// Add keys whose last seen value and mod_revision are kept (then forgotten all at once).
constexpr size_t kMaxKnownKeys = 4096;
}  // namespace

EtcdKv::EtcdKv(EtcdClient* client, std::string prefix, const BackendOptions& options)
    : client_(client), prefix_(std::move(prefix)), options_(options) {}

void EtcdKv::NoteRevision(int64_t rev) {
  int64_t cur = revision_.load();
  while (rev > cur && !revision_.compare_exchange_weak(cur, rev)) {
  }
}
void EtcdKv::AddEntry(const mvccpb::KeyValue& kv, StoreState* view) const {
  Entry& e = view->kv[kv.key().substr(prefix_.size())];
  e.value = kv.value();
  e.revision = kv.mod_revision();
  e.lease = kv.lease();
}

absl::Status EtcdKv::ReadPrefix(const std::string& prefix, bool values, StoreState* view,
                                absl::Time deadline) {
  pb::RangeRequest q;
  q.set_key(prefix_ + prefix);
  q.set_range_end(PrefixRangeEnd(prefix_ + prefix));
  q.set_keys_only(!values);
  return ReadRange(q, absl::StrCat("a read of prefix '", prefix, "'"), view, deadline);
}
absl::Status EtcdKv::ReadRange(const pb::RangeRequest& q, const std::string& what, StoreState* view,
                               absl::Time deadline) {
  pb::RangeResponse resp;
  RETURN_IF_ERROR(client_->Call(what, true, deadline,
                                [&](const EtcdClient::Stubs& s, grpc::ClientContext* ctx) {
                                  return s.kv->Range(ctx, q, &resp);
                                }));
  for (const auto& kv : resp.kvs()) AddEntry(kv, view);
  view->revision = std::max(view->revision, resp.header().revision());
  NoteRevision(view->revision);
  return absl::OkStatus();
}

// One key: a plain Range (what a plain etcd client sends). More: one transaction of range
// reads per kMaxOpsPerTxn keys (each chunk a consistent snapshot).
absl::Status EtcdKv::ReadKeys(const std::vector<std::string>& keys, StoreState* view,
                              absl::Time deadline) {
  if (keys.size() == 1) {
    pb::RangeRequest q;
    q.set_key(prefix_ + keys[0]);
    return ReadRange(q, absl::StrCat("a read of '", keys[0], "'"), view, deadline);
  }
  for (size_t begin = 0; begin < keys.size(); begin += kMaxOpsPerTxn) {
    const size_t end = std::min(keys.size(), begin + kMaxOpsPerTxn);
    pb::TxnRequest txn;
    for (size_t i = begin; i < end; ++i) {
      txn.add_success()->mutable_request_range()->set_key(prefix_ + keys[i]);
    }
    pb::TxnResponse resp;
    RETURN_IF_ERROR(
        client_->Call(absl::StrCat("a read of ", end - begin, " key(s) from '", keys[begin], "'"),
                      true, deadline, [&](const EtcdClient::Stubs& s, grpc::ClientContext* ctx) {
                        return s.kv->Txn(ctx, txn, &resp);
                      }));
    for (const auto& op : resp.responses()) {
      for (const auto& kv : op.response_range().kvs()) AddEntry(kv, view);
    }
    view->revision = std::max(view->revision, resp.header().revision());
  }
  NoteRevision(view->revision);
  return absl::OkStatus();
}

// EvaluateBatch: every request names the same keys; they are applied in order on one view and
// written in one transaction. Only a batch of one may answer kMustWait. Set and MultiSet do not
// depend on what is stored (etcd itself checks a Set's lease), so they write without reading.
// `read_revision` (kMustWait only): the etcd revision of the read that found the keys missing.
Applied EtcdKv::EvaluateBatch(const std::vector<std::pair<const Request*, Response*>>& batch,
                              absl::Time deadline, int64_t* read_revision) {
  std::vector<std::pair<const Request*, Response*>> live;
  for (const auto& [req, r] : batch) {
    Response checked = OnEmptyState(*req, options_);
    if (checked.code() == static_cast<int>(absl::StatusCode::kInvalidArgument) &&
        !req->has_add()) {  // an Add's INVALID_ARGUMENT (not a number) depends on the value
      SetError(r, absl::StatusCode::kInvalidArgument, checked.message());
    } else {
      live.emplace_back(req, r);
    }
  }
  if (live.empty()) return Applied::kAnswered;
  const Request& first = *live.front().first;
  // A fenced write must read (and compare) its fence key, so it is never blind.
  const bool blind = (first.has_set() || first.has_multi_set()) && !first.has_fence();
  const std::vector<std::string> keys = blind ? std::vector<std::string>() : KeysOf(first);
  // An add whose key this backend wrote or read before starts from that guess instead of a read:
  // its compare-and-write checks the guess (the key's mod_revision), so a write that succeeds
  // was applied on the current value. A guess that writes nothing proves nothing: it is read.
  const bool add = first.has_add() && keys.size() == 1;
  std::optional<StoreState> known;  // the view to use next (a guess, or a failed Txn's reads)
  if (add) known = Known(keys[0]);
  bool guessed = known.has_value();
  for (int attempt = 1;; ++attempt) {
    StoreState view;
    absl::Status s;
    if (known) {
      view = std::move(*known);
      known.reset();
    } else {
      guessed = false;
      s = blind                        ? absl::OkStatus()
          : PrefixOf(first) != nullptr ? ReadPrefix(*PrefixOf(first), false, &view, deadline)
                                       : ReadKeys(keys, &view, deadline);
      if (s.ok() && add) Remember(keys[0], view);
    }
    if (!s.ok()) {
      for (const auto& [req, r] : live) SetStatus(r, s);
      return Applied::kAnswered;
    }
    AssumeLease(first, &view);
    absl::flat_hash_map<std::string, int64_t> read_at;  // mod_revision as read (0 = absent)
    for (const auto& [k, e] : view.kv) read_at[k] = e.revision;
    Recorder rec;
    ApplyContext ctx{options_, base::RealClock(), &rec};
    std::vector<Response> outs(live.size());
    for (size_t i = 0; i < live.size(); ++i) {
      outs[i].set_id(live[i].second->id());
      if (Apply(view, ctx, *live[i].first, &outs[i]) == Applied::kMustWait) {
        if (read_revision != nullptr) *read_revision = view.revision;
        return Applied::kMustWait;  // (a Get/Wait/MultiGet: batches of one)
      }
    }
    if (rec.changes.empty()) {
      if (guessed) continue;  // (read, then apply again)
      for (size_t i = 0; i < live.size(); ++i) *live[i].second = std::move(outs[i]);
      return Applied::kAnswered;
    }
    pb::TxnRequest txn = CompareAndWrite(prefix_, keys, read_at, rec.changes);
    // A lost compare returns the keys as they are then: the next attempt needs no read.
    if (txn.compare_size() > 0 && keys.size() <= kMaxOpsPerTxn && PrefixOf(first) == nullptr) {
      for (const std::string& k : keys) {
        txn.add_failure()->mutable_request_range()->set_key(prefix_ + k);
      }
    }
    pb::TxnResponse resp;
    // A lone unconditional put (a Set) is sent as a plain Put, the cheaper call.
    const bool put =
        txn.compare_size() == 0 && txn.success_size() == 1 && txn.success(0).has_request_put();
    s = client_->Call(absl::StrCat("a write of ", rec.changes.size(), " key(s) from '",
                                   rec.changes.begin()->first, "'"),
                      IdempotentRequest(first), deadline,
                      [&](const EtcdClient::Stubs& st, grpc::ClientContext* c) {
                        if (!put) return st.kv->Txn(c, txn, &resp);
                        pb::PutResponse pr;
                        grpc::Status g = st.kv->Put(c, txn.success(0).request_put(), &pr);
                        resp.set_succeeded(g.ok());
                        *resp.mutable_header() = pr.header();
                        return g;
                      });
    if (absl::IsNotFound(s) && first.has_set()) {  // etcd: "requested lease not found"
      *live.front().second = OnEmptyState(first, options_);
      live.front().second->set_id(first.id());
      return Applied::kAnswered;
    }
    if (!s.ok()) {
      if (txn.compare_size() > kMaxOpsPerTxn || txn.success_size() > kMaxOpsPerTxn) {
        s = absl::Status(s.code(), absl::StrCat(s.message(), " (", rec.changes.size(),
                                                " keys in one write; etcd allows "
                                                "--max-txn-ops, default 128)"));
      }
      for (size_t i = 0; i < live.size(); ++i) {
        // An add that failed on its own (not a number, overflow) keeps its own answer, unless
        // it came from an unconfirmed guess.
        if (outs[i].code() != 0 && !guessed) {
          *live[i].second = std::move(outs[i]);
        } else {
          SetStatus(live[i].second, s);
        }
      }
      return Applied::kAnswered;
    }
    if (resp.succeeded()) {
      NoteRevision(resp.header().revision());
      if (add) {
        const Recorder::Change& c = rec.changes.begin()->second;
        StoreState now;
        now.kv[keys[0]] = Entry{c.value, resp.header().revision(), c.lease};
        Remember(keys[0], now);
      }
      for (size_t i = 0; i < live.size(); ++i) {
        Response& out = outs[i];
        if (out.has_set()) out.mutable_set()->set_revision(resp.header().revision());
        if (out.has_multi_set()) out.mutable_multi_set()->set_revision(resp.header().revision());
        *live[i].second = std::move(out);
      }
      return Applied::kAnswered;
    }
    guessed = false;
    if (txn.failure_size() > 0) {
      known.emplace();
      for (const auto& op : resp.responses()) {
        for (const auto& kv : op.response_range().kvs()) AddEntry(kv, &*known);
      }
      known->revision = resp.header().revision();
      NoteRevision(known->revision);
      if (add) Remember(keys[0], *known);
    }
    if (absl::Now() >= deadline) {
      for (const auto& [req, r] : live) {
        SetError(r, absl::StatusCode::kUnavailable,
                 absl::StrCat("gave up after ", attempt,
                              " attempts lost to concurrent writers "
                              "of the same key(s) in etcd; retry"));
      }
      return Applied::kAnswered;
    }
  }
}

bool EtcdKv::StartOneTrip(const Request& req, absl::Time deadline, OneTripDone finish) {
  const bool set = req.has_set() && !req.has_fence();
  // (A blocking Get often finds its key missing: the usual path reads once more and parks it.)
  if (!set && !(req.has_get() && !req.get().wait())) return false;
  if (OnEmptyState(req, options_).code() == static_cast<int>(absl::StatusCode::kInvalidArgument)) {
    return false;  // (EvaluateBatch answers it without a call)
  }
  struct Trip {
    Request req;
    grpc::ClientContext ctx;
    pb::PutRequest put;
    pb::PutResponse put_resp;
    pb::RangeRequest range;
    pb::RangeResponse range_resp;
  };
  auto t = std::make_shared<Trip>();
  if (!client_->PrepareAsync(&t->ctx, deadline)) return false;
  t->req = req;
  pb::KV::Stub* kv = client_->Current().kv;
  // The answer as EvaluateBatch gives it: the apply function on the view the call returned.
  auto answer = [this, t, finish = std::move(finish)](const grpc::Status& s, StoreState view) {
    if (!s.ok()) return finish(std::nullopt);
    const int64_t revision = view.revision;  // of the call (the apply moves the view's)
    NoteRevision(revision);
    Response r;
    r.set_id(t->req.id());
    AssumeLease(t->req, &view);
    if (Apply(view, ApplyContext{options_, base::RealClock(), nullptr}, t->req, &r) ==
            Applied::kMustWait ||
        (t->req.has_set() && r.code() != 0)) {
      return finish(std::nullopt);
    }
    if (r.has_set()) r.mutable_set()->set_revision(revision);
    finish(std::move(r));
  };
  if (set) {
    t->put.set_key(prefix_ + req.set().key());
    t->put.set_value(req.set().value());
    t->put.set_lease(req.set().lease_id());
    kv->async()->Put(&t->ctx, &t->put, &t->put_resp, [t, answer](grpc::Status s) {
      StoreState view;
      view.revision = t->put_resp.header().revision();
      answer(s, std::move(view));
    });
  } else {
    t->range.set_key(prefix_ + req.get().key());
    kv->async()->Range(&t->ctx, &t->range, &t->range_resp, [this, t, answer](grpc::Status s) {
      StoreState view;
      for (const auto& kv : t->range_resp.kvs()) AddEntry(kv, &view);
      view.revision = t->range_resp.header().revision();
      answer(s, std::move(view));
    });
  }
  return true;
}

// Last known state of add keys (a guess; see EvaluateBatch).
std::optional<StoreState> EtcdKv::Known(const std::string& key) {
  absl::MutexLock l(&known_mu_);
  auto it = known_.find(key);
  if (it == known_.end()) return std::nullopt;
  StoreState view;
  view.kv[key] = it->second;
  view.revision = it->second.revision;
  return view;
}
void EtcdKv::Remember(const std::string& key, const StoreState& view) {
  absl::MutexLock l(&known_mu_);
  auto it = view.kv.find(key);
  if (it == view.kv.end()) {
    known_.erase(key);
    return;
  }
  if (known_.size() >= kMaxKnownKeys && !known_.contains(key)) known_.clear();
  known_[key] = it->second;
}

}  // namespace ember::store
