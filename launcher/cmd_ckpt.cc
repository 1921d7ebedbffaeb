// emberctl ckpt inspect|export: checkpoints and safetensors files (checkpoint/tools.h).
#include <iostream>

#include "absl/strings/numbers.h"
#include "checkpoint/tools.h"
#include "launcher/cli.h"

namespace ember::cli {

int RunCkptInspect(Ctl& ctl) {
  ckpt::InspectOptions o;
  o.json = ctl.json() || ctl.args().Has("--json");
  o.verify = ctl.args().Has("--verify");
  auto r = ckpt::InspectCheckpoint(ctl.rest()[0], o);
  if (!r.ok()) return ctl.Fail(r.status());
  std::cout << r->text << "\n";
  if (!r->checks.ok()) {  // a damaged checkpoint is never exit 0
    std::cerr << "emberctl: " << r->checks.message() << "\n";
    return kJobFailed;
  }
  return kOk;
}

int RunCkptExport(Ctl& ctl) {
  const Args& a = ctl.args();
  ckpt::ExportOptions o;
  o.include_optimizer = a.Has("--include-optimizer");
  if (a.Has("--max-shard-bytes") &&
      (!absl::SimpleAtoi(a.Get("--max-shard-bytes"), &o.max_shard_bytes) ||
       o.max_shard_bytes <= 0)) {
    return ctl.UsageError("--max-shard-bytes wants a positive byte count, got '" +
                          a.Get("--max-shard-bytes") + "'");
  }
  const std::string& out = ctl.rest()[1];
  auto r = ckpt::ExportSafetensors(ctl.rest()[0], out, o);
  if (!r.ok()) return ctl.Fail(r.status());
  std::cout << "wrote " << *r << " bytes to " << out << "\n";
  return kOk;
}

}  // namespace ember::cli
