// Test helpers: a deterministic model state (global tensors) and its per-rank shards.
#ifndef EMBER_CHECKPOINT_TEST_UTIL_H_
#define EMBER_CHECKPOINT_TEST_UTIL_H_

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"

namespace ember::ckpt::testing {

struct GlobalTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;  // full, row-major
};

// Values depend on (name, element index, step), so every rank regenerates the same global state.
inline std::vector<GlobalTensor> MakeModel(int64_t step, int64_t scale = 1) {
  std::vector<GlobalTensor> out;
  auto add = [&](std::string name, DType dt, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    GlobalTensor t{name, dt, shape, std::string(n * DTypeSize(dt), '\0')};
    uint32_t seed = 2166136261u;  // FNV-1a of the name: stable forever (the v1 fixture depends on it)
    for (char c : name) seed = (seed ^ static_cast<unsigned char>(c)) * 16777619u;
    seed ^= static_cast<uint32_t>(step * 2654435761u);
    for (int64_t i = 0; i < n; ++i) {
      seed = seed * 1664525u + 1013904223u;
      float f = static_cast<float>(static_cast<int32_t>(seed >> 8) - (1 << 23)) / (1 << 20);
      if (dt == DType::kF32) std::memcpy(&t.bytes[i * 4], &f, 4);
      if (dt == DType::kBF16) { uint16_t b = base::F32ToBf16(f); std::memcpy(&t.bytes[i * 2], &b, 2); }
      if (dt == DType::kI64) { int64_t v = seed; std::memcpy(&t.bytes[i * 8], &v, 8); }
    }
    out.push_back(std::move(t));
  };
  add("embed.weight", DType::kF32, {10 * scale, 6});
  add("layer0.w", DType::kBF16, {7 * scale, 3});
  add("layer0.b", DType::kF32, {5});
  add("tiny", DType::kF32, {1, 4});
  add("optim.embed.weight.exp_avg", DType::kF32, {10 * scale, 6});
  add("optim.embed.weight.exp_avg_sq", DType::kF32, {10 * scale, 6});
  add("counts", DType::kI64, {3, 2});
  return out;
}

inline uint64_t RowBytesOf(const GlobalTensor& t) { return *RowBytes(t.dtype, t.shape); }

inline std::string Rows(const GlobalTensor& t, int64_t b, int64_t e) {
  return t.bytes.substr(b * RowBytesOf(t), (e - b) * RowBytesOf(t));
}

// Rank `rank`'s state at `world`: torch.chunk shards of every tensor. Views into `model`.
inline RankState ShardState(const std::vector<GlobalTensor>& model, int64_t step, int rank, int world) {
  RankState st;
  st.step = step;
  for (const GlobalTensor& t : model) {
    auto [b, e] = ShardRows(t.shape[0], rank, world);
    ShardSpec s{t.name, t.dtype, t.shape, b,
                absl::string_view(t.bytes).substr(b * RowBytesOf(t), (e - b) * RowBytesOf(t))};
    st.tensors.push_back(s);
  }
  st.rng_state = absl::StrCat("rng-of-rank-", rank, "-step-", step, std::string("\0\x01\xff", 3));
  st.data_loader_state = absl::StrCat("sample=", step * 1000 + rank);
  st.extra = {{"lr", "0.001"}, {"model", "tiny-gpt"}};
  st.parallelism = {{"fsdp", absl::StrCat(world)}};
  return st;
}

inline std::string TmpDir(const std::string& name) {
  const char* t = getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(t ? t : "/tmp", "/", name);
  (void)RemoveAll(dir);
  (void)base::MakeDirs(dir, kDirMode);
  return dir;
}

}  // namespace ember::ckpt::testing

#endif  // EMBER_CHECKPOINT_TEST_UTIL_H_
