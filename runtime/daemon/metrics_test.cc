// MetricsExporter: what a scrape shows for a known snapshot, the label bounds and the series cap,
// and reading the newest line of a rank's metrics file.
#include "runtime/daemon/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <unistd.h>
#include <string>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ember::daemon {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/ember_metrics_test_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}

const char* kLine =
    "{\"step\":40,\"loss\":2.5,\"local_loss\":2.25,\"lr\":0.001,\"grad_norm\":null,"
    "\"tokens_per_s\":1000,\"step_s\":0.5,\"comm_wait_s\":0.125,\"peak_rss_bytes\":1048576,"
    "\"state_bytes\":10,\"bytes\":{\"all_gather\":{\"bf16\":4096,\"f32\":8},\"reduce_scatter\":"
    "{\"f32\":2048},\"all_reduce\":{},\"reduce_scatter_promoted\":0},\"checkpoint_save_s\":1.5,"
    "\"flight_entries\":77}";

// The sample value of the series printed exactly as `series` ("name{labels}"), NaN if absent.
double Value(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      return std::strtod(std::string(line.substr(series.size() + 1)).c_str(), nullptr);
    }
  }
  return std::nan("");
}

TEST_CASE("a metrics line of the format before StepMetrics parses into a rank report") {
  auto r = ParseRankReport(kLine);
  REQUIRE(r.ok());
  const jobs::v1::StepMetrics& m = r->metrics;
  REQUIRE(m.step() == 40);
  REQUIRE(m.loss() == 2.5);
  REQUIRE(m.local_loss() == 2.25);
  REQUIRE(m.comm_wait_s() == 0.125);
  REQUIRE(m.checkpoint_save_s() == 1.5);
  REQUIRE(m.flight_entries() == 77);
  REQUIRE(!m.has_grad_norm());  // null
  REQUIRE(m.collective_bytes_size() == 3);
  REQUIRE(m.collective_bytes(0).collective() == "all_gather");
  REQUIRE(m.collective_bytes(0).dtype() == "bf16");
  REQUIRE(m.collective_bytes(0).bytes() == 4096);
  REQUIRE(m.has_reduce_scatter_promoted_bytes());
  REQUIRE(!ParseRankReport("{\"loss\":1}").ok());
  REQUIRE(!ParseRankReport("not json").ok());
  auto old = ParseRankReport("{\"step\":3,\"loss\":1}");  // a line from before the new fields
  REQUIRE(old.ok());
  REQUIRE(!old->metrics.has_checkpoint_save_s());
  REQUIRE(!old->metrics.has_flight_entries());
  REQUIRE(!old->metrics.has_step_s());
}

TEST_CASE("a StepMetrics line (protobuf's JSON form) parses into a rank report") {
  auto r = ParseRankReport(
      "{\"step\":\"7\",\"loss\":1.5,\"peak_rss_bytes\":\"123456789012\",\"collective_bytes\":"
      "[{\"collective\":\"all_gather\",\"dtype\":\"f32\",\"bytes\":\"64\"}],\"mfu\":0.25,"
      "\"attempt\":0,\"a_field_from_a_newer_worker\":3}");
  REQUIRE(r.ok());
  REQUIRE(r->metrics.step() == 7);
  REQUIRE(r->metrics.peak_rss_bytes() == 123456789012);
  REQUIRE(r->metrics.collective_bytes(0).bytes() == 64);
  REQUIRE(r->metrics.mfu() == 0.25);
  REQUIRE(r->metrics.has_attempt());
}

TEST_CASE("Prometheus names of StepMetrics fields spell units out") {
  const auto* d = jobs::v1::StepMetrics::descriptor();
  auto name = [&](const char* f) { return PrometheusName(*d->FindFieldByName(f)); };
  REQUIRE(name("step_s").first == "ember_rank_step_seconds");
  REQUIRE(name("tokens_per_s").first == "ember_rank_tokens_per_second");
  REQUIRE(name("unix_ms") == std::pair<std::string, double>("ember_rank_unix_seconds", 1e-3));
  REQUIRE(name("local_loss") == std::pair<std::string, double>("ember_rank_local_loss", 1));
}

TEST_CASE("the newest complete line of a metrics file is read, a partial one ignored") {
  const std::string path = TempDir() + "/rank-0.jsonl";
  REQUIRE(ReadLastRankReport(path).status().code() == absl::StatusCode::kNotFound);
  {
    std::ofstream f(path);
    // Over 64 KiB of older lines, so the tail read must find the last one at the end.
    for (int i = 0; i < 500; ++i) f << "{\"step\":" << i << ",\"loss\":" << i << ".5}\n";
    f << kLine << "\n";
    f << "{\"step\":41,\"loss\":";  // being written
  }
  auto r = ReadLastRankReport(path);
  REQUIRE(r.ok());
  REQUIRE(r->metrics.step() == 40);
  REQUIRE(r->age_s >= 0);
  REQUIRE(r->age_s < 60);
  { std::ofstream f(path); f << "{\"step\":1"; }
  REQUIRE(ReadLastRankReport(path).status().code() == absl::StatusCode::kNotFound);
}

MetricsSnapshot Snapshot(const std::string& dir, int finished_jobs) {
  MetricsSnapshot s;
  s.node = "n1";
  s.leader = true;
  s.cpu_slots = 4;
  s.devices = {{"cpu", 4}, {"cuda", 1}};
  s.devices_in_use = {{"cpu", 2}};
  s.memory_total_bytes = 1000;
  s.memory_available_bytes = 400;
  s.nvml = true;
  GpuSample g;
  g.index = 0;
  g.name = "NVIDIA H200";
  g.uuid = "GPU-1";
  g.memory_used_bytes = 3 * 1048576;
  g.memory_total_bytes = 10 * 1048576;
  g.utilization_pct = 55;
  g.power_mw = 123500;
  g.temperature_c = 40;
  g.sm_clock_mhz = 1980;
  g.ecc_corrected_volatile = 2;
  s.gpus.push_back(g);
  s.workers = 2;
  jobs::v1::Job run;
  run.set_id("job-run");
  run.set_state(jobs::v1::RUNNING);
  run.set_world_size(2);
  run.add_attempts();
  run.add_attempts();
  s.jobs.push_back(run);
  for (int i = 0; i < finished_jobs; ++i) {
    jobs::v1::Job done;
    done.set_id(absl::StrCat("job-done-", i));
    done.set_state(jobs::v1::SUCCEEDED);
    done.set_end_unix_ms(1000 + i);  // higher i = newer
    s.jobs.push_back(done);
  }
  for (int rank = 0; rank < 2; ++rank) {
    std::string path = absl::StrCat(dir, "/rank-", rank, ".jsonl");
    std::ofstream(path) << kLine << "\n";
    s.ranks.push_back({"job-run", 1, rank, path});
  }
  s.ranks.push_back({"job-run", 1, 5, dir + "/missing.jsonl"});  // not reported yet: no series
  return s;
}

TEST_CASE("a scrape shows node, GPU, job and rank series with bounded labels") {
  MetricsExporter exporter({.finished_jobs = 3});
  exporter.ObserveStoreOp("heartbeat", 0.002);
  exporter.CountRestart();
  const std::string text = exporter.Render(Snapshot(TempDir(), 20));
  INFO(text);
  REQUIRE(Value(text, "ember_node_devices{kind=\"cuda\"}") == 1);
  REQUIRE(Value(text, "ember_node_devices_in_use{kind=\"cpu\"}") == 2);
  REQUIRE(Value(text, "ember_node_memory_available_bytes") == 400);
  const std::string gpu = "{gpu=\"0\",uuid=\"GPU-1\",model_name=\"NVIDIA H200\"}";
  REQUIRE(Value(text, "DCGM_FI_DEV_GPU_UTIL" + gpu) == 55);
  REQUIRE(Value(text, "DCGM_FI_DEV_FB_USED" + gpu) == 3);
  REQUIRE(Value(text, "DCGM_FI_DEV_FB_FREE" + gpu) == 7);
  REQUIRE(Value(text, "DCGM_FI_DEV_POWER_USAGE" + gpu) == 123.5);
  REQUIRE(Value(text, "DCGM_FI_DEV_SM_CLOCK" + gpu) == 1980);
  REQUIRE(Value(text, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" + gpu) == 2);
  REQUIRE(std::isnan(Value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" + gpu)));  // unknown: absent
  REQUIRE(Value(text, "ember_jobs{state=\"succeeded\"}") == 20);
  REQUIRE(Value(text, "ember_jobs{state=\"running\"}") == 1);
  REQUIRE(Value(text, "ember_jobs{state=\"failed\"}") == 0);
  REQUIRE(Value(text, "ember_job_restarts{job_id=\"job-run\"}") == 1);
  REQUIRE(Value(text, "ember_job_state{job_id=\"job-run\",state=\"running\"}") == 1);
  // Only the 3 newest finished jobs keep a job label.
  for (int i = 0; i < 20; ++i) {
    const bool kept = i >= 17;
    INFO(i);
    REQUIRE(std::isnan(Value(text, absl::StrCat("ember_job_attempts{job_id=\"job-done-", i, "\"}"))) ==
            !kept);
  }
  REQUIRE(Value(text, "ember_job_loss{job_id=\"job-run\"}") == 2.5);
  REQUIRE(Value(text, "ember_job_step{job_id=\"job-run\"}") == 40);
  REQUIRE(Value(text, "ember_rank_loss{job_id=\"job-run\",rank=\"1\"}") == 2.5);
  REQUIRE(Value(text, "ember_rank_local_loss{job_id=\"job-run\",rank=\"1\"}") == 2.25);
  REQUIRE(Value(text, "ember_rank_state_bytes{job_id=\"job-run\",rank=\"1\"}") == 10);
  REQUIRE(std::isnan(Value(text, "ember_rank_grad_norm{job_id=\"job-run\",rank=\"1\"}")));  // null
  // Every numeric field's family is declared, with or without a sample.
  REQUIRE(text.find("# TYPE ember_rank_mfu gauge") != std::string::npos);
  REQUIRE(text.find("# TYPE ember_rank_publish_dropped gauge") != std::string::npos);
  REQUIRE(Value(text, "ember_rank_comm_wait_seconds{job_id=\"job-run\",rank=\"1\"}") == 0.125);
  REQUIRE(Value(text, "ember_rank_collective_bytes{job_id=\"job-run\",rank=\"0\",collective="
                      "\"all_gather\",dtype=\"bf16\"}") == 4096);
  REQUIRE(Value(text, "ember_rank_checkpoint_save_seconds{job_id=\"job-run\",rank=\"0\"}") == 1.5);
  REQUIRE(Value(text, "ember_rank_flight_entries{job_id=\"job-run\",rank=\"0\"}") == 77);
  REQUIRE(std::isnan(Value(text, "ember_rank_step{job_id=\"job-run\",rank=\"5\"}")));
  REQUIRE(Value(text, "ember_daemon_restarts_total") == 1);
  REQUIRE(Value(text, "ember_store_op_duration_seconds_count{op=\"heartbeat\"}") == 1);
  REQUIRE(Value(text, "ember_metrics_series_dropped") == 0);
  REQUIRE(text.find("# TYPE ember_job_loss gauge") != std::string::npos);
  // Prometheus' own checker (format and lint: names, label case, counter suffixes, help texts),
  // on a scrape that has every kind of series, GPU ones included.
  if (access("/usr/bin/promtool", X_OK) != 0) {
    WARN("SKIPPED: promtool is not installed (Debian package prometheus)");
    return;
  }
  const std::string path = TempDir() + "/metrics.txt";
  std::ofstream(path) << text;
  const std::string out = path + ".out";
  const int rc = std::system(("/usr/bin/promtool check metrics < " + path + " > " + out + " 2>&1").c_str());
  std::ifstream f(out);
  std::string said((std::istreambuf_iterator<char>(f)), {});
  INFO(said);
  REQUIRE(rc == 0);
}

TEST_CASE("a non-scheduler daemon leaves cluster-wide job series out") {
  MetricsSnapshot s = Snapshot(TempDir(), 2);
  s.leader = false;
  const std::string text = MetricsExporter({}).Render(s);
  REQUIRE(std::isnan(Value(text, "ember_jobs{state=\"running\"}")));
  REQUIRE(Value(text, "ember_job_loss{job_id=\"job-run\"}") == 2.5);  // rank 0 runs here
}

TEST_CASE("the series cap drops what is over it and says how many") {
  MetricsExporter exporter({.finished_jobs = 1000, .max_series = 50});
  const std::string text = exporter.Render(Snapshot(TempDir(), 100));
  int samples = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty() && line[0] != '#' && !absl::StartsWith(line, "ember_store_op") &&
        !absl::StartsWith(line, "ember_daemon_worker_starts") &&
        !absl::StartsWith(line, "ember_daemon_restarts") &&
        !absl::StartsWith(line, "ember_metrics_")) {
      ++samples;
    }
  }
  REQUIRE(samples == 50);
  REQUIRE(Value(text, "ember_metrics_series_dropped") > 400);
}

}  // namespace
}  // namespace ember::daemon
