// ProcessGroup's subgroups: NewGroup, Split, Shrink (process_group.h states the contracts).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/process_group.h"

namespace ember::comm {

// --- subgroups --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::NewGroup(const std::vector<int>& ranks,
                                                                     const std::string& name) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || sorted.front() < 0 || sorted.back() >= size_ ||
      std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return absl::InvalidArgumentError(absl::StrCat("new_group: ranks [", absl::StrJoin(ranks, ","),
                                                   "] are not distinct ranks of group '",
                                                   opts_.name, "' (size ", size_, ")"));
  if (backend_->SplitsInPlace()) {
    // The communicator library splits (every rank takes part; non-members get no group).
    auto pos = std::find(ranks.begin(), ranks.end(), rank_);
    const bool member = pos != ranks.end();
    return DeviceSplit(member ? 0 : -1, static_cast<int>(pos - ranks.begin()), name, ".g", ranks);
  }
  // A collective over this group whose descriptor carries a hash of the rank list: ranks that
  // pass different lists, or that are doing something else, get a clear mismatch error.
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks) h = (h ^ static_cast<uint64_t>(r + 1)) * 1099511628211ull;
  OpDesc d;
  d.type = OpType::kGroupCreate;
  d.dtype = DataType::kU8;
  d.count = h & 0xffffffffull;
  std::shared_ptr<Work> w = Submit(d, 1, {.tag = "new_group"});
  RETURN_IF_ERROR(w->Wait());
  if (std::find(ranks.begin(), ranks.end(), rank_) == ranks.end()) return nullptr;
  return CreateSubgroup(name.empty() ? absl::StrCat(opts_.name, ".g", w->seq()) : name, ranks);
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Split(int color, int key,
                                                                  const std::string& name) {
  if (backend_->SplitsInPlace()) return DeviceSplit(color, key, name, ".s", {});
  std::vector<int64_t> mine = {color, key};
  std::vector<int64_t> all(2 * size_);
  std::shared_ptr<Work> w = AllGatherSingle(mine.data(), all.data(), 2, DataType::kI64,
                                            {.tag = "split"});
  RETURN_IF_ERROR(w->Wait());
  if (color < 0) return nullptr;
  std::vector<std::pair<int64_t, int>> order;
  for (int r = 0; r < size_; ++r)
    if (all[2 * r] == color) order.emplace_back(all[2 * r + 1], r);
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  for (auto& [k, r] : order) members.push_back(r);
  return CreateSubgroup(
      name.empty() ? absl::StrCat(opts_.name, ".s", w->seq(), ".c", color) : name, members);
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::CreateSubgroup(
    const std::string& name, const std::vector<int>& members) {
  GroupOptions o = ChildOptions(name, members);
  int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  return Create(rdzv_, new_rank, static_cast<int>(members.size()), std::move(o));
}

GroupOptions ProcessGroup::ChildOptions(const std::string& name,
                                        const std::vector<int>& members) const {
  GroupOptions o = opts_;
  o.name = name;
  o.global_ranks.clear();
  for (int r : members) o.global_ranks.push_back(opts_.global_ranks[r]);
  o.global_rank = opts_.global_rank;
  return o;
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::DeviceSplit(int color, int key,
                                                                         const std::string& name,
                                                                         const char* kind,
                                                                         const std::vector<int>& members) {
  // The split is a collective on the parent communicator: let the group's queued ops go first,
  // and take a sequence number like an op, so the derived name is the same on every rank.
  int64_t seq;
  {
    absl::MutexLock l(&mu_);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return (queue_.empty() && running_ == nullptr) || aborted_;
    };
    mu_.Await(absl::Condition(&idle));
    if (aborted_) {
      return absl::AbortedError(absl::StrCat("split of group '", opts_.name, "': group aborted: ",
                                             abort_status_.message()));
    }
    seq = ++next_seq_;
    last_completed_seq_ = seq;
  }
  const std::string child_name =
      !name.empty() ? name
                    : absl::StrCat(opts_.name, kind, seq, color >= 0 ? absl::StrCat(".c", color) : "");
  // The backend learns its rank and size in the child from the library.
  absl::StatusOr<std::unique_ptr<Backend>> b =
      backend_->Split(color, key, MakeBackendOptions(-1, -1, child_name));
  if (absl::IsFailedPrecondition(b.status()) && color < 0) return nullptr;  // not a member
  if (!b.ok()) return base::Annotate(b.status(), absl::StrCat("split of group '", opts_.name, "'"));
  // Split (not NewGroup) does not tell us the members' global ranks: the child numbers them 0..n-1.
  GroupOptions o = ChildOptions(child_name, members);
  const int r = (*b)->GroupRank(), n = (*b)->GroupSize();
  return CreateWithBackend(rdzv_, r, n, std::move(o), std::move(*b));
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Shrink(
    const std::vector<int>& excluded_ranks, const std::string& name) {
  std::vector<int> ex = excluded_ranks;
  std::sort(ex.begin(), ex.end());
  if (std::adjacent_find(ex.begin(), ex.end()) != ex.end() || (!ex.empty() && (ex.front() < 0 ||
      ex.back() >= size_)) || static_cast<int>(ex.size()) >= size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shrink: excluded ranks [", absl::StrJoin(excluded_ranks, ","), "] must be distinct ranks "
        "of group '", opts_.name, "' (size ", size_, ") leaving at least one"));
  }
  if (std::binary_search(ex.begin(), ex.end(), rank_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shrink: rank ", rank_, " of group '", opts_.name, "' excludes itself; only the "
        "survivors call Shrink"));
  }
  std::vector<int> members;
  for (int r = 0; r < size_; ++r)
    if (!std::binary_search(ex.begin(), ex.end(), r)) members.push_back(r);
  const int n = ++shrinks_;
  const std::string child_name =
      !name.empty() ? name : absl::StrCat(opts_.name, ".shrink", n, ".x", absl::StrJoin(ex, "_"));
  GroupOptions o = ChildOptions(child_name, members);
  const int new_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  if (!backend_->SplitsInPlace()) {
    // cpu: a fresh bootstrap of the survivors through the store (the old group may be aborted).
    return Create(rdzv_, new_rank, static_cast<int>(members.size()), std::move(o));
  }
  absl::StatusOr<std::unique_ptr<Backend>> b =
      backend_->Shrink(ex, MakeBackendOptions(new_rank, static_cast<int>(members.size()), child_name));
  if (!b.ok()) return base::Annotate(b.status(), absl::StrCat("shrink of group '", opts_.name, "'"));
  return CreateWithBackend(rdzv_, new_rank, static_cast<int>(members.size()), std::move(o),
                           std::move(*b));
}

}  // namespace ember::comm
