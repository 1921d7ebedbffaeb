// The model driver: the one forward/backward sequence over a model's units. Plain training, FSDP
// (runtime/fsdp FullyShard) and pipeline stages (runtime/pipeline) all run the model through it;
// what differs between them is only where each unit's weights and gradients live and what happens
// before and after each unit, which a UnitHooks implementation supplies.
//
// The model is any model::Model (model.h): units in forward order, unit 0 the embedding, units
// 1..N the blocks, unit N+1 the head (UnitCount = N + 2); for GPT/Llama (MakeGptModel):
//   unit 0          "embed"     x = wte[tokens] (+ wpe[t] for gpt)          params: wte, [wpe]
//   unit 1 .. L     "blocks.l"  x = Block_l(x)                              params: BlockParamSpecs
//   unit L + 1      "head"      loss = LCE(RMSNorm(x; ln_f), head weight)   params: ln_f, wte | lm_head
// Parameters are named by their index in the model's ParamSpecs() (Model::UnitParams lists a
// unit's, in the order it takes them). The tied LM head makes wte a parameter of two units.
//
// A Part is a contiguous range of units: the whole model for plain and FSDP training, a pipeline
// stage otherwise. A part that starts at unit 0 reads tokens, else an activation x[B*T, C]; a part
// that ends at the head produces the loss (its backward is seeded with dloss), else an activation.
//
// Per micro-batch: Forward, then (for training) Backward, optionally split in two for zero-bubble
// pipeline schedules: Backward(kInputOnly) computes the input gradient and the cheap gradients and
// defers the blocks' linear weight gradients to BackwardWeight; the result is bitwise equal to the
// fused Backward. The head's forward computes its gradients too (fused linear cross-entropy), so
// its Backward only hands the saved gradient on.
//
// Hooks: Before(phase, unit) runs before a unit's computation of that phase and After(phase, unit)
// after it; Weight(p) and Grad(p) are asked for between them (never cached across units), so an
// implementation may gather parameters just in time and free them after. Plain training uses
// DenseParams (flat buffers, no-op hooks).
//
// Thread safety: a Driver is immutable after construction and may be shared; one micro-batch's
// MicroBatch state is used by one thread at a time.
//
//   Driver d(MakeGptModel(cfg), Part::Whole(*model));
//   MicroBatch mb;
//   ASSIGN_OR_RETURN(float loss, d.Forward(ctx, hooks, {.tokens = tok, .targets = tgt, .B = B,
//                                                       .T = T, .dloss = 1, .backward = true}, &mb));
//   RETURN_IF_ERROR(d.Backward(ctx, hooks, &mb, /*dy=*/nullptr, /*dx=*/nullptr));
#ifndef EMBER_RUNTIME_MODEL_DRIVER_H_
#define EMBER_RUNTIME_MODEL_DRIVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/exec_context.h"
#include "kernels/tensor.h"
#include "runtime/model/gpt.h"
#include "runtime/model/model.h"

namespace ember::model {

int UnitCount(const Model& m);
std::string UnitName(const Model& m, int unit);  // "embed", "blocks.<b>", "head"

// Units [first, last] (inclusive).
struct Part {
  int first = 0, last = 0;
  static Part Whole(const Model& m) { return {0, UnitCount(m) - 1}; }
  bool has_embed() const { return first == 0; }
  bool has_head(const Model& m) const { return last == UnitCount(m) - 1; }
  bool contains(int unit) const { return unit >= first && unit <= last; }
  // Pipeline stage `stage` of `stages` (NumBlocks divisible by stages): its blocks; stage 0 also
  // the embedding, the last stage the head.
  static Part Stage(const Model& m, int stage, int stages);
};

enum class Phase { kForward, kBackward, kBackwardWeight };

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual absl::Status Before(Phase phase, int unit) { return absl::OkStatus(); }
  // After a unit's phase. For kForward of a block or the embedding, `x` is the unit's output
  // activation [n] (an implementation may round it to a lower precision in place); else null.
  virtual absl::Status After(Phase phase, int unit, float* x, int64_t n) { return absl::OkStatus(); }
  // The compute values of parameter p (ParamSpecs index), valid until After of the same phase.
  virtual const float* Weight(int p) = 0;
  // Where parameter p's gradient is accumulated.
  virtual float* Grad(int p) = 0;
};

// Flat parameters and gradients of every parameter (ParamSpecs order), no-op hooks: plain
// single-process training (Gpt).
class DenseParams : public UnitHooks {
 public:
  DenseParams(float* params, float* grads, std::vector<int64_t> offsets)
      : params_(params), grads_(grads), offsets_(std::move(offsets)) {}
  const float* Weight(int p) override { return params_ + offsets_[p]; }
  float* Grad(int p) override { return grads_ + offsets_[p]; }

 private:
  float* params_;
  float* grads_;
  std::vector<int64_t> offsets_;
};

// What one micro-batch keeps between its Forward and its Backward / BackwardWeight. Movable.
struct MicroBatch {
  const int32_t* tokens = nullptr;  // the embedding's backward reads them again
  int64_t B = 0, T = 0;
  bool backward = false;
  std::vector<UnitStatePtr> acts;      // per block of the part
  std::vector<UnitStatePtr> deferred;  // split backward: per block, last to first
  kernels::Tensor head_dx;             // the head's gradient w.r.t. its input
};

struct ForwardArgs {
  const int32_t* tokens = nullptr;   // [B*T], when the part has the embedding
  const float* x = nullptr;          // [B*T*C], otherwise
  const int32_t* targets = nullptr;  // [B*T], when the part has the head
  int64_t B = 0, T = 0;
  float dloss = 1.0f;                // the head's backward seed (e.g. 1/micro-batches)
  bool backward = true;              // keep activations (false: loss / output only)
};

enum class BackwardMode { kFull, kInputOnly };

class Driver {
 public:
  Driver(std::shared_ptr<const Model> model, Part part);

  const Model& model() const { return *model_; }
  const Part& part() const { return part_; }

  // Runs the part's units forward. With the head: returns the loss (reduced, unscaled) and, when
  // args.backward, keeps the head's input gradient; `y` is unused. Without it: writes the output
  // activation [B*T*C] to `y` and returns 0. InvalidArgument for T > context or a token outside the
  // vocabulary.
  absl::StatusOr<float> Forward(const kernels::ExecContext& ctx, UnitHooks& hooks,
                                const ForwardArgs& args, MicroBatch* mb, float* y) const;

  // Backward of a micro-batch Forward kept activations for. `dy` [B*T*C] is the output gradient
  // when the part has no head (ignored otherwise); `dx` receives the input gradient when it has no
  // embedding (ignored otherwise). kInputOnly defers the blocks' linear weight gradients to
  // BackwardWeight.
  absl::Status Backward(const kernels::ExecContext& ctx, UnitHooks& hooks, MicroBatch* mb,
                        const float* dy, float* dx, BackwardMode mode = BackwardMode::kFull) const;
  absl::Status BackwardWeight(const kernels::ExecContext& ctx, UnitHooks& hooks,
                              MicroBatch* mb) const;

 private:
  const std::shared_ptr<const Model> model_;
  const Part part_;
  std::vector<std::vector<int>> unit_params_;  // per unit of the part
};

}  // namespace ember::model

#endif  // EMBER_RUNTIME_MODEL_DRIVER_H_
