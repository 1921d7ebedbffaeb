// emberctl fr analyze: explains a hang from a job's flight-recorder dumps (runtime/flight).
#include <iostream>

#include "launcher/cli.h"
#include "runtime/flight/analyze.h"

namespace ember::cli {

int RunFrAnalyze(Ctl& ctl) {
  auto r = fr::AnalyzeDir(ctl.rest()[0]);
  if (!r.ok()) return ctl.Fail(r.status());
  std::cout << (ctl.json() || ctl.args().Has("--json") ? r->ToJson() : r->ToText()) << "\n";
  return r->problem ? kJobFailed : kOk;
}

}  // namespace ember::cli
