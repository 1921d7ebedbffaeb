// Model: what the training stack needs of a model architecture. The driver (driver.h), FSDP
// (runtime/fsdp FullyShard), the pipeline (runtime/pipeline) and the worker's checkpoints use only
// this interface, so adding an architecture is one folder: a Model implementation and its
// registration (registry.h; docs/adding-a-model.md).
//
// A model is a sequence of units, in forward order:
//   unit 0              the embedding: tokens[B*T] -> x[B*T, Width()]
//   units 1 .. N        blocks (N = NumBlocks()): x -> x
//   unit N + 1          the head: x, targets -> loss (and, for training, its gradients at once)
// Each unit reads parameters named by index into ParamSpecs() (UnitParams). A parameter may belong
// to two units (a head tied to the embedding); the pipeline then keeps a copy on each stage and
// sums their gradients.
//
// Thread safety: implementations are immutable after construction; every method is const and may
// be called from several threads (kernels inside use the ExecContext's pool).
#ifndef EMBER_RUNTIME_MODEL_MODEL_H_
#define EMBER_RUNTIME_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/exec_context.h"
#include "kernels/tensor.h"
#include "runtime/model/gpt.h"

namespace ember::model {

// What a block keeps between its forward and backward (or between the input and the weight halves
// of a split backward). Implementations derive from it.
struct UnitState {
  virtual ~UnitState() = default;
};
using UnitStatePtr = std::unique_ptr<UnitState>;

class Model {
 public:
  virtual ~Model() = default;

  // The registered architecture name ("gpt", "llama", ...).
  virtual std::string arch() const = 0;
  // Every parameter in a fixed order: name, shape (dim 0 is what FSDP shards), init rule
  // (InitParam in gpt.h initialises any slice from (seed, name) alone).
  virtual const std::vector<ParamSpec>& ParamSpecs() const = 0;
  virtual int NumBlocks() const = 0;
  virtual int64_t Width() const = 0;    // C of the activations [B*T, C] between units
  virtual int64_t Context() const = 0;  // the largest T
  // Indices into ParamSpecs() of a unit's parameters, in the order its methods take them.
  virtual std::vector<int> UnitParams(int unit) const = 0;

  // The embedding. InvalidArgument for a token outside the vocabulary.
  virtual absl::Status EmbedForward(const kernels::ExecContext& ctx, absl::Span<const float* const> w,
                                    const int32_t* tokens, int64_t B, int64_t T, float* x) const = 0;
  // Accumulates the embedding's gradients of dx into g.
  virtual void EmbedBackward(const kernels::ExecContext& ctx, absl::Span<float* const> g, const int32_t* tokens,
                             int64_t B, int64_t T, const float* dx) const = 0;

  // Block `b` (0-based) over x into y (y may alias x).
  virtual absl::StatusOr<UnitStatePtr> BlockForward(const kernels::ExecContext& ctx, int b,
                                                    absl::Span<const float* const> w, const float* x, float* y,
                                                    int64_t B, int64_t T) const = 0;
  // Backward from dy into dx (may alias), accumulating into g; consumes `state`.
  virtual absl::Status BlockBackward(const kernels::ExecContext& ctx, int b, absl::Span<const float* const> w,
                                     absl::Span<float* const> g, UnitStatePtr state, const float* dy,
                                     float* dx) const = 0;
  // The split backward (zero-bubble schedules): dx and the cheap gradients now, the rest in
  // BlockBackwardWeight; together bitwise equal to BlockBackward. The default defers nothing.
  virtual absl::StatusOr<UnitStatePtr> BlockBackwardInput(const kernels::ExecContext& ctx, int b,
                                                          absl::Span<const float* const> w,
                                                          absl::Span<float* const> g, UnitStatePtr state,
                                                          const float* dy, float* dx) const {
    absl::Status st = BlockBackward(ctx, b, w, g, std::move(state), dy, dx);
    if (!st.ok()) return st;
    return UnitStatePtr();
  }
  virtual absl::Status BlockBackwardWeight(const kernels::ExecContext& ctx, int b, absl::Span<float* const> g,
                                           UnitStatePtr deferred) const {
    return absl::OkStatus();
  }

  // The head: the reduced loss of x against targets; with dx != nullptr also the backward scaled by
  // dloss (*dx becomes the [B*T, C] input gradient; g accumulated).
  virtual absl::StatusOr<float> HeadLoss(const kernels::ExecContext& ctx, absl::Span<const float* const> w,
                                         const float* x, const int32_t* targets, int64_t B, int64_t T,
                                         float dloss, kernels::Tensor* dx, absl::Span<float* const> g) const = 0;
};

// GPT and Llama (gpt.h) as a Model.
std::shared_ptr<const Model> MakeGptModel(const GptConfig& cfg);

}  // namespace ember::model

#endif  // EMBER_RUNTIME_MODEL_MODEL_H_
