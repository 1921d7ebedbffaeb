// emberctl weights subscribe: live weights of a running job (docs/onesided.md).
#include <cstdlib>
#include <iostream>

#include "launcher/cli.h"

namespace ember::cli {

int RunWeightsSubscribe(Ctl& ctl) {
  const Args& a = ctl.args();
  const char* env_store = getenv("EMBER_STORE");
  const std::string store = a.Get("--store", env_store ? env_store : "");
  if (store.empty()) return ctl.UsageError("weights subscribe: give --store HOST:PORT (or $EMBER_STORE)");
  if (a.Get("--out").empty()) return ctl.UsageError("weights subscribe: --out DIR is required");
  int steps = 0;
  if (!ctl.IntOption("--steps", 1, &steps)) return kUsage;
  auto client = ctl.Connect();
  if (!client.ok()) return ctl.Fail(client.status());
  auto n = client->SubscribeWeights(ctl.rest()[0], store, Ctl::UserPath(a.Get("--out")), steps,
                                    [&](int64_t step, const std::string& path) {
                                      if (ctl.json()) {
                                        std::cout << "{\"step\": " << step << ", \"path\": " << Ctl::Quote(path) << "}\n";
                                      } else {
                                        std::cout << "step " << step << ": " << path << "\n";
                                      }
                                      std::cout.flush();
                                    });
  if (!n.ok()) return ctl.Fail(n.status());
  if (!ctl.json()) std::cout << *n << " snapshots written\n";
  return kOk;
}

}  // namespace ember::cli
