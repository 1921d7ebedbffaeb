#include "testing/spec_matrix.h"

#include "absl/strings/str_cat.h"

namespace ember::e2e {

std::vector<MatrixSpec> SpecMatrix(const MatrixOptions& o) {
  struct Layout {
    const char* name;
    int world;
    const char* parallelism;
  };
  const Layout layouts[] = {
      {"fsdp1", 1, "strategy: fsdp"},
      {"fsdp2", 2, "strategy: fsdp"},
      {"fsdp4", 4, "strategy: fsdp"},
      {"pp2", 2, "strategy: pipeline, pipeline_stages: 2"},
      {"pp2xfsdp2", 4, "strategy: pipeline, pipeline_stages: 2"},
      {"hsdp2x2", 4, "strategy: fsdp, dp_replicate: 2"},
  };
  std::vector<MatrixSpec> out;
  for (const char* arch : {"gpt", "llama"}) {
    for (const char* mlp : {"gelu", "swiglu", "moe"}) {
      for (const bool bf16 : {false, true}) {
        for (const Layout& l : layouts) {
          for (const bool clip : {false, true}) {
            for (const bool publish : o.with_publish ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
              MatrixSpec m;
              m.name = absl::StrCat(arch, "-", mlp, bf16 ? "-bf16-" : "-fp32-", l.name, clip ? "-clip" : "",
                                    publish ? "-pub" : "");
              m.world = l.world;
              m.yaml = absl::StrCat(
                  "name: ", m.name, "\n", o.data, "\n",
                  "model: {arch: ", arch, ", mlp: ", mlp, ", n_layers: 2, n_heads: 2, d_model: 32, ",
                  "context_length: 16, vocab_size: 256}\n",
                  "optimizer: {lr: 0.001", clip ? ", grad_clip: 1.0" : "", "}\n",
                  "parallelism: {", l.parallelism, ", world_size: ", l.world, "}\n",
                  bf16 ? "precision: {param_dtype: bf16, overrides: [{pattern: \"*ln*\", param_dtype: f32}]}\n" : "",
                  publish ? "publish: {every_steps: 1}\n" : "", "steps: 3\nbatch_size: 2\n");
              out.push_back(std::move(m));
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace ember::e2e
