// Registers the built-in architectures: "gpt" (also the default, "") and "llama", both
// model::GptConfig through ConfigFromSpec (from_spec.h) and MakeGptModel (model.h).
#include "runtime/model/from_spec.h"
#include "runtime/model/model.h"
#include "runtime/model/registry.h"

namespace ember::model {
namespace {

absl::StatusOr<std::shared_ptr<const Model>> FromSpec(const spec::JobSpec& spec) {
  absl::StatusOr<GptConfig> cfg = ConfigFromSpec(spec);
  if (!cfg.ok()) return cfg.status();
  return MakeGptModel(*cfg);
}

const bool kRegistered = RegisterArchitecture("", &FromSpec) && RegisterArchitecture("gpt", &FromSpec) &&
                         RegisterArchitecture("llama", &FromSpec);

}  // namespace
}  // namespace ember::model
