#include "runtime/comm/store_rendezvous.h"

namespace ember::comm {
namespace {

class StoreRendezvous : public Rendezvous {
 public:
  explicit StoreRendezvous(store::Client c) : c_(std::move(c)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return c_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return c_.Get(key, {.wait = true, .timeout = timeout});
  }
  absl::StatusOr<std::string> TryGet(const std::string& key) override {
    return c_.Get(key, {.wait = false, .timeout = absl::Seconds(5)});
  }

 private:
  store::Client c_;
};

}  // namespace

std::shared_ptr<Rendezvous> MakeStoreRendezvous(store::Client client) {
  return std::make_shared<StoreRendezvous>(std::move(client));
}

}  // namespace ember::comm
