// The architecture registry: a model family registers a factory under its `model.arch` name, and
// the training stack builds models through MakeModel (runtime/model/model.h is everything it
// needs of them). Adding an architecture is one folder: a Model implementation plus one
// registration (docs/adding-a-model.md); runtime/fsdp, runtime/pipeline and runtime/worker do not
// change.
//
//   // in the architecture's folder, at namespace scope:
//   const bool kRegistered = ember::model::RegisterArchitecture("toy", &MakeToyFromSpec);
//   ...
//   ASSIGN_OR_RETURN(std::shared_ptr<const Model> m, MakeModel(spec));  // by spec.model().arch()
//
// Thread safety: registration happens during static initialisation (or before any lookup);
// lookups are thread-safe.
#ifndef EMBER_RUNTIME_MODEL_REGISTRY_H_
#define EMBER_RUNTIME_MODEL_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job_spec.pb.h"
#include "runtime/model/model.h"

namespace ember::model {

// Builds the model a (defaulted) job spec describes; INVALID_ARGUMENT naming the field for a value
// the architecture cannot take.
using ModelFactory =
    std::function<absl::StatusOr<std::shared_ptr<const Model>>(const ::ember::spec::v1::JobSpec& spec)>;

// Registers `name` ("" is the default architecture). Returns true so it can initialise a static;
// a second registration of the same name is refused (false, logged to stderr).
bool RegisterArchitecture(const std::string& name, ModelFactory factory);

// The model of spec.model().arch; NOT_FOUND naming the registered architectures for another name.
absl::StatusOr<std::shared_ptr<const Model>> MakeModel(const ::ember::spec::v1::JobSpec& spec);

// Registered names, sorted.
std::vector<std::string> RegisteredArchitectures();

}  // namespace ember::model

#endif  // EMBER_RUNTIME_MODEL_REGISTRY_H_
