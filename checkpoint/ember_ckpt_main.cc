// ember-ckpt: inspect and export Ember checkpoints until `emberctl ckpt` exists.
//
//   ember-ckpt inspect [--json] [--verify] <checkpoint dir | root | file.safetensors | index.json>
//   ember-ckpt export [--max_shard_bytes=N] [--include_optimizer] <checkpoint> <out.safetensors|dir>
#include <cstdio>

#include "absl/flags/flag.h"
#include "checkpoint/tools.h"
#include "runtime/base/flags.h"

ABSL_FLAG(bool, json, false, "inspect: print a JSON summary");
ABSL_FLAG(bool, verify, false, "inspect: checksum every chunk");
ABSL_FLAG(uint64_t, max_shard_bytes, 0, "export: write a sharded set of files of about this size");
ABSL_FLAG(bool, include_optimizer, false, "export: include optim.* tensors");

int main(int argc, char** argv) {
  std::vector<std::string> args = ember::base::ParseFlagsAndInitLogging(argc, argv, "ember-ckpt");
  auto usage = [] {
    std::fprintf(stderr,
                 "usage: ember-ckpt inspect [--json] [--verify] <path>\n"
                 "       ember-ckpt export [--max_shard_bytes=N] [--include_optimizer] <ckpt> <out>\n");
    return 2;
  };
  if (args.size() < 3) return usage();
  if (args[1] == "inspect" && args.size() == 3) {
    auto out = ember::ckpt::InspectCheckpoint(
        args[2], {.json = absl::GetFlag(FLAGS_json), .verify = absl::GetFlag(FLAGS_verify)});
    if (!out.ok()) {
      std::fprintf(stderr, "ember-ckpt: %s\n", out.status().ToString().c_str());
      return 1;
    }
    std::fputs(out->text.c_str(), stdout);
    if (!out->checks.ok()) {
      std::fprintf(stderr, "ember-ckpt: %s\n", out->checks.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (args[1] == "export" && args.size() == 4) {
    auto n = ember::ckpt::ExportSafetensors(
        args[2], args[3],
        {.max_shard_bytes = absl::GetFlag(FLAGS_max_shard_bytes),
         .include_optimizer = absl::GetFlag(FLAGS_include_optimizer)});
    if (!n.ok()) {
      std::fprintf(stderr, "ember-ckpt: %s\n", n.status().ToString().c_str());
      return 1;
    }
    std::printf("exported %llu bytes to %s\n", static_cast<unsigned long long>(*n), args[3].c_str());
    return 0;
  }
  return usage();
}
