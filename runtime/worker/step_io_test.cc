// The worker's three forms of a step's numbers, from one jobs.v1.StepMetrics: the JSON line
// (protobuf's JSON form: proto field names, int64 as strings, unset fields absent, one line), the
// log line, and the helpers that fill the message from FSDP's and the publisher's counters.
#include "runtime/worker/step_io.h"

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "runtime/base/json.h"

namespace ember::worker {
namespace {

StepResult Sample() {
  StepResult r;
  r.set_step(12);
  r.set_loss(2.5);
  r.set_local_loss(2.25);
  r.set_lr(0.001);
  r.set_tokens_per_s(1234);
  r.set_step_s(0.5);
  r.set_comm_wait_s(0.125);
  r.set_peak_rss_bytes(123456789012);
  r.set_attempt(0);  // set to 0: measured, so printed
  fsdp::CommBytes b;
  b.all_gather = {{"bf16", 4096}, {"f32", 8}};
  b.reduce_scatter = {{"f32", 2048}};
  b.reduce_scatter_promoted = 4096;
  SetCommBytes(b, &r);
  SetPublishCounts({.published = 3, .skipped = 1, .dropped = 0}, &r);
  return r;
}

TEST_CASE("the metrics line is StepMetrics' JSON form on one line") {
  const std::string line = MetricsJson(Sample());
  INFO(line);
  REQUIRE(line.find('\n') == std::string::npos);
  auto v = json::Parse(line);  // the strict parser: valid JSON
  REQUIRE(v.ok());
  CHECK(v->Get("step").StrOr() == "12");  // int64: a string, as protobuf prints it
  CHECK(v->Get("loss").as_double() == 2.5);
  CHECK(v->Get("local_loss").as_double() == 2.25);
  CHECK(v->Get("step_s").as_double() == 0.5);  // proto field names, not lowerCamelCase
  CHECK(v->Find("stepS") == nullptr);
  CHECK(v->Get("peak_rss_bytes").StrOr() == "123456789012");
  CHECK(v->Get("attempt").IntOr(-1) == 0);
  CHECK(v->Get("publish_published").StrOr() == "3");
  CHECK(v->Get("publish_dropped").StrOr() == "0");
  CHECK(v->Get("reduce_scatter_promoted_bytes").StrOr() == "4096");
  for (const char* unset : {"grad_norm", "mfu", "device_memory_bytes", "checkpoint_save_s"}) {
    INFO(unset);
    CHECK(v->Find(unset) == nullptr);  // not measured: absent, not 0 or null
  }
  const json::Value& bytes = v->Get("collective_bytes");
  REQUIRE(bytes.is_array());
  REQUIRE(bytes.array().size() == 3);
  CHECK(bytes.array()[0].Get("collective").StrOr() == "all_gather");
  CHECK(bytes.array()[0].Get("dtype").StrOr() == "bf16");
  CHECK(bytes.array()[0].Get("bytes").StrOr() == "4096");
  CHECK(bytes.array()[2].Get("collective").StrOr() == "reduce_scatter");
}

TEST_CASE("the log line is formatted from the StepMetrics") {
  StepResult r = Sample();
  std::string l = LogLine(r, 100, 30);
  INFO(l);
  CHECK(absl::StartsWith(l, "step 12/100 loss 2.5000 lr 0.001 grad_norm - tok/s 1234 eta 30s"));
  CHECK(absl::StrContains(l, "comm_wait 25%"));
  CHECK(absl::StrContains(l, "ag[bf16=4096,f32=8] rs[f32=2048]"));
  CHECK(!absl::StrContains(l, "mfu"));
  CHECK(!absl::StrContains(l, "device_mem"));
  r.set_grad_norm(1.5);
  r.set_mfu(0.25);
  r.set_device_memory_bytes(3000000);
  r.set_device_peak_memory_bytes(5000000);
  l = LogLine(r, 100, 30);
  CHECK(absl::StrContains(l, "grad_norm 1.500 "));
  CHECK(absl::StrContains(l, " mfu 25.00% "));
  CHECK(absl::StrContains(l, "device_mem 3MB (peak 5MB)"));
}

}  // namespace
}  // namespace ember::worker
