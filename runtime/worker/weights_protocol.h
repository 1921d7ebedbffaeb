// The live weight publishing protocol (issue 16; docs/onesided.md "Live weight publishing"),
// shared by the publishing ranks (publisher.h) and a subscriber (subscriber.h). Store keys, all
// relative to the attempt, are in runtime/job/keys.h:
//   - rank 0 writes the manifest (EncodeManifest) under kWeightsManifest (a subscriber uses the
//     newest attempt that has one);
//   - a subscriber allocates one buffer for the whole model (f32 tensors, whole and row-major, back
//     to back in manifest order), puts its descriptor under WeightsSubscriber(name) and connects its
//     onesided agent (key prefix kWeightsOnesided) to every rank's agent, named RankAgent(r);
//   - at a publish step every rank puts its rows into the buffer, then notifies StepMessage(N); the
//     subscriber, once it holds step N from every rank, writes the snapshot and answers every rank
//     AckMessage(N). A rank puts again only after its ack, so the buffer is never overwritten
//     while the subscriber reads it.
// Thread-safe (pure functions).
#ifndef EMBER_RUNTIME_WORKER_WEIGHTS_PROTOCOL_H_
#define EMBER_RUNTIME_WORKER_WEIGHTS_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ember::worker {

// The model as a subscriber sees it: f32 tensors, whole, back to back in this order.
struct WeightsManifest {
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t offset = 0;  // byte offset in the subscriber's buffer
    uint64_t bytes = 0;
  };
  int attempt = 0;
  int world = 0;
  std::vector<Tensor> tensors;
  uint64_t total_bytes = 0;
};

// Text form: "ember-weights v1 attempt=A world=W\n" then "NAME F32 d0,d1,...\n" per tensor.
std::string EncodeManifest(const WeightsManifest& m);
// Fills offsets, bytes and total_bytes; INVALID_ARGUMENT naming the line when malformed.
absl::StatusOr<WeightsManifest> ParseManifest(absl::string_view text);

inline std::string RankAgent(int rank) { return absl::StrCat("rank", rank); }
inline std::string StepMessage(int64_t step) { return absl::StrCat("step ", step); }
inline std::string AckMessage(int64_t step) { return absl::StrCat("ack ", step); }
// The step of a StepMessage (prefix "step ") or AckMessage (prefix "ack "); nullopt otherwise.
std::optional<int64_t> ParseMessage(absl::string_view message, absl::string_view prefix);
// The rank of a RankAgent name; nullopt otherwise.
std::optional<int> ParseRankAgent(absl::string_view name);

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_WEIGHTS_PROTOCOL_H_
