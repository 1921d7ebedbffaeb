// TrainingFlopsPerToken against FLOPs counted by hand, matrix multiply by matrix multiply, for tiny
// configs; DenseBf16Peak's table by device names as cudaDeviceProp reports them.
#include "runtime/model/flops.h"

#include <catch2/catch.hpp>

namespace ember::model {
namespace {

// Forward FLOPs of one token through x[1, k] @ W[k, n]: a multiply-add per weight, 2 FLOPs each.
double Matmul(double k, double n) { return 2 * k * n; }

TEST_CASE("gpt, GELU, full causal: 6N + 12LHQT equals the hand count") {
  GptConfig c;
  c.vocab_size = 8;
  c.context = 4;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 4;  // head_dim 2, d_ff 16
  REQUIRE(c.Validate().ok());
  // One token's forward: qkv 4 -> 12, proj 4 -> 4, fc1 4 -> 16, fc2 16 -> 4, head 4 -> 8; and per
  // head, q.k over 4 keys and the weighted sum of 4 values of width 2.
  const double fwd = Matmul(4, 12) + Matmul(4, 4) + Matmul(4, 16) + Matmul(16, 4) + Matmul(4, 8) +
                     2 /*heads*/ * (2.0 * 4 * 2 /*q.k*/ + 2.0 * 4 * 2 /*a.v*/);
  CHECK(fwd == 512);
  CHECK(MatmulParamsPerToken(c) == 48 + 16 + 128 + 32);
  CHECK(TrainingFlopsPerToken(c, 4) == 3 * fwd);  // backward = 2 x forward
  // A shorter sequence only shrinks the attention term.
  CHECK(TrainingFlopsPerToken(c, 2) == 3 * (fwd - 2 * (2.0 * 2 * 2 + 2.0 * 2 * 2)));
}

TEST_CASE("llama, GQA, SwiGLU, untied head, sliding window: the hand count") {
  GptConfig c = LlamaConfig();
  c.vocab_size = 8;
  c.context = 4;
  c.n_layer = 1;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 8;  // head_dim 2; qkv 8 -> (4 + 2 x 2) x 2 = 16
  c.d_ff = 16;
  c.window = 2;
  REQUIRE(c.Validate().ok());
  const double fwd = Matmul(8, 16) + Matmul(8, 8) + Matmul(8, 32) /*gate and up*/ +
                     Matmul(16, 8) /*down*/ + Matmul(8, 8) /*head*/ +
                     4 /*query heads*/ * (2.0 * 2 * 2 + 2.0 * 2 * 2) /*2 keys of width 2*/;
  CHECK(fwd == 1344);
  CHECK(TrainingFlopsPerToken(c, 4) == 3 * fwd);
  c.tie_embeddings = true;  // the head is a matmul either way
  CHECK(TrainingFlopsPerToken(c, 4) == 3 * fwd);
}

TEST_CASE("MoE counts the gate and the top_k experts a token uses") {
  GptConfig c;
  c.vocab_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 4;
  c.mlp = GptConfig::Mlp::kMoe;
  c.n_expert = 4;
  c.top_k = 2;  // d_ff 16
  const int64_t dense = 48 + 16 + 32;
  CHECK(MatmulParamsPerToken(c) == dense + 4 * 4 + 2 * (64 + 64));
}

TEST_CASE("dense bf16 peaks by device name and compute capability") {
  auto peak = [](const char* name, int major, int minor) {
    absl::StatusOr<DevicePeak> p = DenseBf16Peak(name, major, minor);
    return p.ok() ? p->flops / 1e12 : -1.0;
  };
  CHECK(peak("NVIDIA H200", 9, 0) == 989.4);
  CHECK(peak("NVIDIA H100 80GB HBM3", 9, 0) == 989.4);  // the SXM part's name
  CHECK(peak("NVIDIA H100 PCIe", 9, 0) == 756.5);
  CHECK(peak("NVIDIA A100-SXM4-80GB", 8, 0) == 312);
  CHECK(peak("NVIDIA A100 80GB PCIe", 8, 0) == 312);
  CHECK(peak("NVIDIA A100-SXM4-40GB", -1, -1) == 312);  // no capability check asked
  // Not in the table, or not what the name says: no peak, and the message says why.
  for (const char* other : {"NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA H20", "NVIDIA GH200 480GB",
                            "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB", ""}) {
    absl::StatusOr<DevicePeak> p = DenseBf16Peak(other, 9, 0);
    CHECK(absl::IsNotFound(p.status()));
  }
  absl::StatusOr<DevicePeak> wrong_cc = DenseBf16Peak("NVIDIA H100 80GB HBM3", 8, 0);
  CHECK(absl::IsNotFound(wrong_cc.status()));
  CHECK(wrong_cc.status().message().find("compute capability 8.0") != std::string::npos);
  absl::StatusOr<DevicePeak> unknown = DenseBf16Peak("NVIDIA GeForce RTX 4090", 8, 9);
  CHECK(unknown.status().message().find("'NVIDIA GeForce RTX 4090'") != std::string::npos);
  CHECK(!DenseBf16Peak("NVIDIA H200", 9, 0)->source.empty());
}

}  // namespace
}  // namespace ember::model
