#include "runtime/daemon/series.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "proto/jobs.pb.h"
#include "catch2/catch.hpp"

namespace ember::daemon {
namespace {

std::string Line(int64_t step, double loss, int attempt = 0, double step_s = 0.01,
                 double wait = 0.0) {
  char b[256];
  std::snprintf(b, sizeof b,
                "{\"step\":%lld,\"loss\":%.9g,\"local_loss\":7,\"tokens_per_s\":100,\"step_s\":%.9g,"
                "\"comm_wait_s\":%.9g,\"peak_rss_bytes\":5,\"bytes\":{\"all_reduce\":{\"f32\":8}},"
                "\"attempt\":%d}\n",
                static_cast<long long>(step), loss, step_s, wait, attempt);
  return b;
}

std::string TempPath(const std::string& name) {
  const char* d = std::getenv("TEST_TMPDIR");
  return absl::StrCat(d ? d : "/tmp", "/", name, "-", ::getpid());
}

TEST_CASE("LineNumber finds exact keys only") {
  const std::string l = Line(12, 2.5);
  CHECK(*LineNumber(l, "step") == 12);
  CHECK(*LineNumber(l, "loss") == 2.5);           // not local_loss
  CHECK(*LineNumber(l, "local_loss") == 7);
  CHECK(*LineNumber(l, "step_s") == 0.01);        // not step
  CHECK(!LineNumber(l, "grad_norm").has_value());
  CHECK(std::isnan(*LineNumber("{\"grad_norm\":null}", "grad_norm")));
  CHECK(!LineNumber("{\"loss\":}", "loss").has_value());
}

TEST_CASE("ParseMetricsLine reads top-level numbers in one pass and skips nested objects") {
  MetricsLine m;
  REQUIRE(ParseMetricsLine(Line(12, 2.5, 3, 0.25, 0.125), &m));
  CHECK(m.step == 12);
  CHECK(m.has_attempt);
  CHECK(m.attempt == 3);
  CHECK(m.value[MetricIndex("loss")] == 2.5);
  CHECK(m.value[MetricIndex("local_loss")] == 7);
  CHECK(m.value[MetricIndex("step_s")] == 0.25);
  CHECK(m.value[MetricIndex("comm_wait_s")] == 0.125);
  CHECK(!m.has[MetricIndex("grad_norm")]);
  // "loss" inside a nested object or a string is not the line's loss.
  REQUIRE(ParseMetricsLine(
      "{\"bytes\":{\"loss\":9,\"x\":[1,{\"loss\":8}]},\"note\":\"\\\"loss\\\":7\",\"step\":4,"
      "\"grad_norm\":null}", &m));
  CHECK(m.step == 4);
  CHECK(!m.has[MetricIndex("loss")]);
  CHECK(std::isnan(m.value[MetricIndex("grad_norm")]));
  CHECK(!ParseMetricsLine("{\"loss\":1}", &m));
  CHECK(!ParseMetricsLine("garbage", &m));
  CHECK(MetricIndex("bogus") == -1);
}

// Every numeric field of StepMetrics, set to a distinct value and printed by protobuf's JSON
// printer (int64 as strings), reads back as its metric with that value; unset fields are absent.
TEST_CASE("ParseMetricsLine reads every numeric StepMetrics field of protobuf's JSON form") {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = jobs::v1::StepMetrics::descriptor();
  jobs::v1::StepMetrics msg;
  const google::protobuf::Reflection* r = msg.GetReflection();
  std::map<std::string, double> want;
  int numeric = 0;
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    if (f->is_repeated()) continue;
    const double v = f->name() == "step" ? 12 : 1000 + 3 * i;  // even fields stay unset
    if (f->name() != "step" && i % 2 == 0) {
      ++numeric;
      continue;
    }
    switch (f->cpp_type()) {
      case FD::CPPTYPE_INT32: r->SetInt32(&msg, f, static_cast<int32_t>(v)); break;
      case FD::CPPTYPE_INT64: r->SetInt64(&msg, f, 123456789012345 + static_cast<int64_t>(v)); break;
      case FD::CPPTYPE_DOUBLE: r->SetDouble(&msg, f, v + 0.1); break;
      default: FAIL("StepMetrics has a field type this test does not set: " << f->name());
    }
    ++numeric;
    want[f->name()] = f->cpp_type() == FD::CPPTYPE_INT64 ? 123456789012345 + v
                      : f->cpp_type() == FD::CPPTYPE_DOUBLE ? v + 0.1 : v;
  }
  jobs::v1::CollectiveBytes* c = msg.add_collective_bytes();
  c->set_collective("all_gather");
  c->set_bytes(9);
  std::string line;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  REQUIRE(google::protobuf::util::MessageToJsonString(msg, &line, o).ok());
  INFO(line);
  CHECK(NumMetrics() == numeric);
  MetricsLine m;
  REQUIRE(ParseMetricsLine(line, &m));
  for (int i = 0; i < NumMetrics(); ++i) {
    const std::string& name = MetricNames()[i];
    INFO(name);
    auto it = want.find(name);
    REQUIRE(static_cast<bool>(m.has[i]) == (it != want.end()));
    if (it != want.end()) {
      CHECK(m.value[i] == it->second);
      CHECK(LineNumber(line, name) == it->second);
    }
  }
}

TEST_CASE("CanonicalMetric maps aliases and names the accepted ones") {
  CHECK(*CanonicalMetric("") == "loss");
  CHECK(*CanonicalMetric("step_time") == "step_s");
  CHECK(*CanonicalMetric("memory") == "peak_rss_bytes");
  CHECK(*CanonicalMetric("tokens_per_s") == "tokens_per_s");
  auto bad = CanonicalMetric("bogus");
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("tokens_per_s") != std::string::npos);
}

// Every bucket's min/max/last must equal a brute-force pass over the steps it claims to cover.
TEST_CASE("Downsampler buckets agree with a brute-force reference and keep spikes") {
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0, 1);
  for (int n : {1, 10, 999, 1000, 1001, 100000}) {
    for (int max_points : {1, 7, 1000, 2000}) {
      Downsampler ds(4096);
      std::vector<double> v(n);
      for (int i = 0; i < n; ++i) {
        v[i] = 5 - std::log1p(i) + 0.1 * noise(rng);
        if (i == n / 3) v[i] = 1000;  // a spike
        ds.Add(i + 1, v[i]);
      }
      auto b = ds.Buckets(max_points);
      INFO("n=" << n << " max_points=" << max_points);
      REQUIRE(static_cast<int>(b.size()) <= max_points);
      REQUIRE(static_cast<int>(b.size()) >= std::min(n, max_points / 2));
      int64_t total = 0, prev_last = 0;
      bool spike = false;
      for (const Bucket& k : b) {
        REQUIRE(k.first_step > prev_last);
        REQUIRE(k.first_step <= k.last_step);
        double lo = INFINITY, hi = -INFINITY;
        for (int64_t s = k.first_step; s <= k.last_step; ++s) {
          lo = std::min(lo, v[s - 1]);
          hi = std::max(hi, v[s - 1]);
        }
        CHECK(k.min == lo);
        CHECK(k.max == hi);
        CHECK(k.last == v[k.last_step - 1]);
        CHECK(k.count == k.last_step - k.first_step + 1);
        total += k.count;
        prev_last = k.last_step;
        spike |= k.max == 1000;
      }
      CHECK(total == n);
      CHECK(spike);
    }
  }
}

TEST_CASE("Downsampler: a repeated step (resumed attempt) becomes last; NaN dropped") {
  Downsampler ds(8);
  ds.Add(1, 3);
  ds.Add(2, 2);
  ds.Add(2, 9);
  ds.Add(3, std::nan(""));
  auto b = ds.Buckets(100);
  REQUIRE(b.size() == 2);
  CHECK(b[1].last == 9);
  CHECK(b[1].min == 2);
  CHECK(ds.dropped() == 1);
}

TEST_CASE("SeriesReader reads appended lines incrementally, per attempt, and restarts on truncation") {
  const std::string path = TempPath("series.jsonl");
  std::remove(path.c_str());
  SeriesReader reader;
  auto none = reader.Read(path, "loss", -1, 100);
  REQUIRE(none.ok());
  CHECK(none->missing);
  {
    std::ofstream f(path);
    for (int s = 1; s <= 50; ++s) f << Line(s, 10.0 / s);
    f << "{\"step\":51,\"loss\":0.1";  // a line still being written
  }
  auto a = reader.Read(path, "loss", -1, 1000);
  REQUIRE(a.ok());
  CHECK(a->lines == 50);
  REQUIRE(a->buckets.size() == 50);
  CHECK(a->buckets[9].last == 1.0);
  {
    std::ofstream f(path, std::ios::app);
    f << ",\"attempt\":1}\n";
    for (int s = 40; s <= 60; ++s) f << Line(s, 1.0 / s, 1);
  }
  auto b = reader.Read(path, "loss", -1, 1000);
  REQUIRE(b.ok());
  CHECK(b->lines == 50 + 1 + 21);
  REQUIRE(b->buckets.size() == 60);
  CHECK(b->buckets[44].last == Approx(1.0 / 45));  // attempt 1's value replaced attempt 0's
  CHECK(b->buckets[44].max == Approx(10.0 / 45));
  SeriesReader fresh;
  auto c = fresh.Read(path, "loss", -1, 1000);
  REQUIRE(c.ok());
  CHECK(c->lines == b->lines);
  auto only1 = fresh.Read(path, "loss", 1, 1000);
  REQUIRE(only1.ok());
  CHECK(only1->lines == 22);
  CHECK(only1->buckets.front().first_step == 40);
  { std::ofstream f(path); f << Line(1, 4.0); }  // truncated: read again from the start
  auto d = reader.Read(path, "loss", -1, 1000);
  REQUIRE(d.ok());
  CHECK(d->lines == 1);
  CHECK(d->buckets[0].last == 4.0);
  std::remove(path.c_str());
}

TEST_CASE("TailStats averages the current attempt's last lines; FindStragglers marks the slow rank") {
  const std::string path = TempPath("tail.jsonl");
  {
    std::ofstream f(path);
    for (int s = 1; s <= 10; ++s) f << Line(s, 1, 0, 9.0, 0.0);  // an older attempt: ignored
    for (int s = 5; s <= 30; ++s) f << Line(s, 1, 1, 0.5, s % 2 ? 0.1 : 0.3);
  }
  auto t = TailStats(path, 4, -1);
  REQUIRE(t.ok());
  CHECK(t->step == 30);
  CHECK(t->lines == 4);
  CHECK(t->step_s == Approx(0.5));
  CHECK(t->comm_wait_s == Approx(0.2));
  CHECK(t->busy_s == Approx(0.3));
  CHECK(absl::IsNotFound(TailStats(path + ".none", 4, -1).status()));
  std::remove(path.c_str());

  auto rs = [](double busy, int64_t step) {
    RecentStats r;
    r.lines = 5;
    r.busy_s = busy;
    r.step = step;
    return r;
  };
  CHECK(FindStragglers({rs(0.1, 10), rs(0.1, 10), rs(0.16, 10), rs(0.1, 10)}) ==
        std::vector<bool>{false, false, true, false});
  CHECK(FindStragglers({rs(0.1, 10), rs(0.14, 10)}) == std::vector<bool>{false, false});
  CHECK(FindStragglers({rs(0.1, 10), rs(0.5, 10)}) == std::vector<bool>{false, true});
  CHECK(FindStragglers({rs(0.1, 10), rs(0.1, 2)}, 1.5, 4) == std::vector<bool>{false, true});
  RecentStats silent;
  CHECK(FindStragglers({rs(0.1, 10), silent}) == std::vector<bool>{false, false});
}

}  // namespace
}  // namespace ember::daemon
