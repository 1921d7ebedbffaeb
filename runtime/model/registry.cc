#include "runtime/model/registry.h"

#include <cstdio>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ember::model {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, ModelFactory> factories;
};

Registry& Get() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

bool RegisterArchitecture(const std::string& name, ModelFactory factory) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.factories.emplace(name, std::move(factory)).second) {
    std::fprintf(stderr, "model registry: architecture '%s' registered twice; the first one stays\n", name.c_str());
    return false;
  }
  return true;
}

absl::StatusOr<std::shared_ptr<const Model>> MakeModel(const ::ember::spec::v1::JobSpec& spec) {
  ModelFactory f;
  {
    Registry& r = Get();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(spec.model().arch());
    if (it == r.factories.end()) {
      std::vector<std::string> names;
      for (const auto& [k, v] : r.factories) names.push_back(k.empty() ? "\"\" (default)" : k);
      return absl::NotFoundError(absl::StrCat("model.arch: '", spec.model().arch(),
                                              "' is not a registered architecture; registered: ",
                                              absl::StrJoin(names, ", ")));
    }
    f = it->second;
  }
  return f(spec);
}

std::vector<std::string> RegisteredArchitectures() {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [k, v] : r.factories) names.push_back(k);
  return names;
}

}  // namespace ember::model
