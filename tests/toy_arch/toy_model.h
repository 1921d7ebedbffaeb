// A toy architecture, registered as model.arch "toy": everything it takes to add a model to Ember
// (docs/adding-a-model.md), in this one folder. It exists to prove that FSDP, HSDP and PP x FSDP
// apply to any model::Model without changes to runtime/fsdp, runtime/pipeline or runtime/worker.
//
//   embed:  x = E[tok]                                 E [V, C]
//   block:  y = x + tanh(x W^T + b)                    W [C, C], b [C]
//   head:   loss = mean CE(x E^T, targets)             tied to E
//
// Config from the spec: model.vocab_size, d_model, n_layers, context_length, init_std.
#ifndef EMBER_TESTS_TOY_ARCH_TOY_MODEL_H_
#define EMBER_TESTS_TOY_ARCH_TOY_MODEL_H_

#include <cstdint>
#include <memory>

#include "runtime/model/model.h"

namespace ember::toy {

struct ToyConfig {
  int64_t vocab = 11, width = 8, blocks = 2, context = 16;
  float init_std = 0.3f;
};

std::shared_ptr<const model::Model> MakeToy(const ToyConfig& cfg);

}  // namespace ember::toy

#endif  // EMBER_TESTS_TOY_ARCH_TOY_MODEL_H_
