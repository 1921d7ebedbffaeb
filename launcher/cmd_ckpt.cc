// emberctl ckpt inspect|export: checkpoints and safetensors files (checkpoint/tools.h).
#include <iostream>

#include "absl/strings/numbers.h"
#include "checkpoint/hf_layout.h"
#include "checkpoint/tools.h"
#include "launcher/cli.h"
#include "runtime/jobspec/spec.h"
#include "runtime/worker/model_state.h"

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
  const std::string format = a.Has("--format") ? a.Get("--format") : "safetensors";
  if (format == "hf") {
    if (o.include_optimizer) return ctl.UsageError("--include-optimizer: the hf format holds weights only");
    ckpt::HfExportOptions h;
    h.max_shard_bytes = o.max_shard_bytes;
    const std::string dt = a.Has("--dtype") ? a.Get("--dtype") : "f32";
    if (dt == "f32") {
      h.dtype = ckpt::DType::kF32;
    } else if (dt == "bf16") {
      h.dtype = ckpt::DType::kBF16;
    } else if (dt == "f16") {
      h.dtype = ckpt::DType::kF16;
    } else {
      return ctl.UsageError("--dtype wants f32, bf16 or f16, got '" + dt + "'");
    }
    if (a.Has("--spec")) {
      auto s = spec::LoadJobSpec(a.Get("--spec"));
      if (!s.ok()) return ctl.Fail(s.status());
      auto c = worker::HfConfigForSpec(*s);
      if (!c.ok()) return ctl.Fail(c.status());
      h.config = *c;
    }
    auto r = ckpt::ExportHf(ctl.rest()[0], out, h);
    if (!r.ok()) return ctl.Fail(r.status());
    std::cout << "wrote " << *r << " bytes of Hugging Face Llama weights and config.json to " << out << "\n";
    return kOk;
  }
  if (format != "safetensors") return ctl.UsageError("--format wants safetensors or hf, got '" + format + "'");
  if (a.Has("--dtype") || a.Has("--spec")) return ctl.UsageError("--dtype and --spec go with --format hf");
  auto r = ckpt::ExportSafetensors(ctl.rest()[0], out, o);
  if (!r.ok()) return ctl.Fail(r.status());
  std::cout << "wrote " << *r << " bytes to " << out << "\n";
  return kOk;
}

}  // namespace ember::cli
