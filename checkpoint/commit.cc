#include "checkpoint/commit.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"

namespace ember::ckpt {
namespace {
std::string DoneKey(int64_t step, int rank) { return absl::StrCat("ckpt/", step, "/done/", rank); }
std::string OutcomeKey(int64_t step) { return absl::StrCat("ckpt/", step, "/outcome"); }
}  // namespace

absl::Status LocalCommitProtocol::MarkDone(int64_t step, int rank, const std::string& token) {
  absl::MutexLock l(&mu_);
  done_[step][rank] = token;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> LocalCommitProtocol::WaitAllDone(int64_t step, int world,
                                                                          absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = done_.find(step);
    if (it == done_.end()) return false;
    for (const auto& [r, t] : it->second) {
      if (absl::StartsWith(t, "error")) return true;  // a failed rank ends the wait early
    }
    return static_cast<int>(it->second.size()) >= world;
  };
  mu_.AwaitWithTimeout(absl::Condition(&all), timeout);
  std::vector<std::string> tokens(world);
  std::vector<std::string> missing;
  for (int r = 0; r < world; ++r) {
    auto it = done_[step].find(r);
    if (it == done_[step].end()) missing.push_back(absl::StrCat(r)); else tokens[r] = it->second;
  }
  for (const std::string& t : tokens) if (absl::StartsWith(t, "error")) return tokens;
  if (!missing.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("checkpoint step ", step, ": ranks ", absl::StrJoin(missing, ","), " did not finish"));
  }
  return tokens;
}

absl::Status LocalCommitProtocol::Publish(int64_t step, const std::string& outcome) {
  absl::MutexLock l(&mu_);
  outcome_[step] = outcome;
  return absl::OkStatus();
}

absl::StatusOr<std::string> LocalCommitProtocol::WaitOutcome(int64_t step, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outcome_.count(step) > 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&has), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("checkpoint step ", step, ": no outcome from rank 0"));
  }
  return outcome_[step];
}

absl::Status LocalCommitProtocol::Forget(int64_t step) {
  absl::MutexLock l(&mu_);
  done_.erase(step);
  outcome_.erase(step);
  return absl::OkStatus();
}

absl::Status StoreCommitProtocol::MarkDone(int64_t step, int rank, const std::string& token) {
  return client_.Set(DoneKey(step, rank), token);
}

absl::StatusOr<std::vector<std::string>> StoreCommitProtocol::WaitAllDone(int64_t step, int world,
                                                                          absl::Duration timeout) {
  // Poll in slices so that an "error" vote from any rank ends the wait early.
  absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(DoneKey(step, r));
  while (true) {
    auto got = client_.MultiGet(keys);
    if (!got.ok()) return got.status();
    std::vector<std::string> tokens(world), missing;
    bool failed = false;
    for (int r = 0; r < world; ++r) {
      if ((*got)[r].has_value()) {
        tokens[r] = *(*got)[r];
        failed |= absl::StartsWith(tokens[r], "error");
      } else {
        missing.push_back(absl::StrCat(r));
      }
    }
    if (failed || missing.empty()) return tokens;
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "checkpoint step ", step, ": ranks ", absl::StrJoin(missing, ","), " did not finish"));
    }
    // Block on the first missing key for a short slice (wakes as soon as it appears).
    absl::Status w = client_.Wait({DoneKey(step, std::stoi(missing[0]))},
                                  std::min(left, absl::Milliseconds(200)));
    if (!w.ok() && w.code() != absl::StatusCode::kDeadlineExceeded) return w;
  }
}

absl::Status StoreCommitProtocol::Claim(int64_t step, int rank) {
  return client_.Set(absl::StrCat("ckpt/", step, "/claim/", rank), "");
}

absl::Status StoreCommitProtocol::Publish(int64_t step, const std::string& outcome) {
  return client_.Set(OutcomeKey(step), outcome);
}

absl::StatusOr<std::string> StoreCommitProtocol::WaitOutcome(int64_t step, absl::Duration timeout) {
  auto v = client_.Get(OutcomeKey(step), {.wait = true, .timeout = timeout});
  if (v.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::DeadlineExceededError(absl::StrCat("checkpoint step ", step, ": no outcome from rank 0 within ",
                                                    absl::FormatDuration(timeout)));
  }
  return v;
}

absl::Status StoreCommitProtocol::Forget(int64_t step) {
  return client_.DeletePrefix(absl::StrCat("ckpt/", step, "/")).status();
}

}  // namespace ember::ckpt
