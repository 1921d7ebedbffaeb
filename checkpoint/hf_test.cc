// Hugging Face Llama export/import (hf_config.h, hf_layout.h) on synthetic checkpoints: the
// layout and rotary permutation against torch's view/transpose written out as loops, export ->
// import -> export bitwise, dtypes, sharding, and every refusal. The model-level check (a PyTorch
// Llama reading the export) is tests/interop.
#include "checkpoint/hf_layout.h"

#include <cstring>
#include <fstream>
#include <random>
#include <set>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/test_util.h"
#include "runtime/base/json.h"

namespace ember::ckpt {
namespace {

using testing::TmpDir;

HfLlamaConfig TinyConfig() {
  HfLlamaConfig c;
  c.vocab_size = 11;
  c.hidden_size = 16;  // H = 4 heads of hd = 4
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.f;
  return c;
}

struct Model {
  std::vector<HfParam> layout;
  std::map<std::string, std::vector<float>> values;  // Ember name -> row-major values
};

Model RandomModel(const HfLlamaConfig& c, uint32_t seed) {
  Model m{LlamaHfLayout(c), {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const HfParam& p : m.layout) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    std::vector<float>& v = m.values[p.name];
    for (int64_t i = 0; i < n; ++i) v.push_back(nd(rng));
  }
  return m;
}

// Saves `m` as an Ember checkpoint at step 7 (world 1) with the records the worker writes.
std::string Save(const std::string& root, const Model& m, const std::map<std::string, std::string>& extra) {
  LocalCommitProtocol protocol;
  RankState st;
  st.step = 7;
  st.extra = extra;
  for (const HfParam& p : m.layout) {
    const std::vector<float>& v = m.values.at(p.name);
    absl::string_view bytes(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    st.tensors.push_back({p.name, DType::kF32, p.shape, 0, bytes});
    st.tensors.push_back({"optim." + p.name + ".exp_avg", DType::kF32, p.shape, 0, bytes});
  }
  REQUIRE(SaveCheckpoint({.root = root, .rank = 0, .world_size = 1}, st, &protocol).ok());
  return root;
}

std::map<std::string, std::string> Records(const HfLlamaConfig& c) {
  return {{kExtraModelArch, "llama"}, {kExtraHfConfig, HfConfigJson(c)}};
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::vector<float> HfTensorF32(const std::string& dir, const std::string& name) {
  auto set = SafetensorsSet::Open(PathExists(dir + "/model.safetensors.index.json")
                                      ? dir + "/model.safetensors.index.json"
                                      : dir + "/model.safetensors");
  REQUIRE(set.ok());
  auto found = (*set)->Find(name);
  REQUIRE(found.ok());
  auto [file, info] = *found;
  absl::string_view b = file->Data(*info);
  std::vector<float> out(b.size() / DTypeSize(info->dtype));
  REQUIRE(ConvertDType(info->dtype, b.data(), DType::kF32, out.data(), out.size()).ok());
  return out;
}

TEST_CASE("the rotary permutation is transformers' view(H, hd/2, 2, C).transpose(1, 2)", "[hf]") {
  for (int64_t hd : {2, 4, 8, 64}) {
    const int64_t H = 3;
    std::vector<int64_t> hf(H * hd);  // hf[row] = the Ember row it holds, from the torch recipe
    for (int64_t h = 0; h < H; ++h)
      for (int64_t a = 0; a < 2; ++a)
        for (int64_t i = 0; i < hd / 2; ++i) hf[(h * 2 + a) * (hd / 2) + i] = (h * (hd / 2) + i) * 2 + a;
    for (int64_t f = 0; f < H * hd; ++f) {
      CHECK(HfToEmberRow(f, hd) == hf[f]);
      CHECK(EmberToHfRow(hf[f], hd) == f);
    }
  }
}

TEST_CASE("export writes Hugging Face names, shapes, permuted q/k and a LlamaForCausalLM config", "[hf]") {
  const HfLlamaConfig c = TinyConfig();
  const Model m = RandomModel(c, 1);
  const std::string root = Save(TmpDir("hf_export_ckpt"), m, Records(c));
  const std::string out = TmpDir("hf_export_out") + "/llama";
  auto n = ExportHf(root, out, {});
  REQUIRE(n.ok());
  const int64_t C = 16, hd = 4, H = 4, KV = 2, F = 12, V = 11;
  CHECK(*n == 4 * (2 * V * C + C + 2 * (2 * C + C * C * 2 + 2 * KV * hd * C + 3 * F * C)));

  auto cfg_json = json::Parse(Slurp(out + "/config.json"));
  REQUIRE(cfg_json.ok());
  CHECK(cfg_json->Get("architectures").array()[0].as_string() == "LlamaForCausalLM");
  CHECK(cfg_json->Get("num_key_value_heads").as_int() == 2);
  CHECK(cfg_json->Get("rms_norm_eps").as_double() == 1e-5);  // shortest float text, not 9.99e-06
  CHECK(cfg_json->Get("rope_theta").as_double() == 500000.0);
  CHECK(cfg_json->Get("rope_scaling").is_null());
  CHECK(cfg_json->Get("tie_word_embeddings").as_bool() == false);
  CHECK(cfg_json->Get("torch_dtype").as_string() == "float32");

  auto file = SafetensorsFile::Open(out + "/model.safetensors");
  REQUIRE(file.ok());
  CHECK((*file)->metadata().at("format") == "pt");
  CHECK((*file)->tensors().size() == 3 + 2 * 9);
  const std::vector<float>& qkv = m.values.at("blocks.1.attn.qkv.weight");
  std::vector<float> q = HfTensorF32(out, "model.layers.1.self_attn.q_proj.weight");
  std::vector<float> k = HfTensorF32(out, "model.layers.1.self_attn.k_proj.weight");
  std::vector<float> v = HfTensorF32(out, "model.layers.1.self_attn.v_proj.weight");
  REQUIRE(q.size() == static_cast<size_t>(H * hd * C));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t i = 0; i < hd / 2; ++i)
        for (int64_t col = 0; col < C; ++col) {
          const int64_t hf_row = (h * 2 + a) * (hd / 2) + i, em_row = (h * (hd / 2) + i) * 2 + a;
          REQUIRE(q[hf_row * C + col] == qkv[em_row * C + col]);
          if (h < KV) REQUIRE(k[hf_row * C + col] == qkv[(H * hd + em_row) * C + col]);
        }
  for (int64_t i = 0; i < KV * hd * C; ++i) REQUIRE(v[i] == qkv[(H + KV) * hd * C + i]);  // v unpermuted
  const std::vector<float>& fc1 = m.values.at("blocks.0.mlp.fc1.weight");
  std::vector<float> gate = HfTensorF32(out, "model.layers.0.mlp.gate_proj.weight");
  std::vector<float> up = HfTensorF32(out, "model.layers.0.mlp.up_proj.weight");
  CHECK(std::equal(gate.begin(), gate.end(), fc1.begin()));
  CHECK(std::equal(up.begin(), up.end(), fc1.begin() + F * C));
  CHECK(HfTensorF32(out, "lm_head.weight") == m.values.at("lm_head.weight"));
  CHECK(HfTensorF32(out, "model.norm.weight") == m.values.at("ln_f.weight"));

  // Exporting into a finished export is refused.
  auto again = ExportHf(root, out, {});
  CHECK(again.status().code() == absl::StatusCode::kAlreadyExists);
}

// Imports `dir` the way ranks of a world would (torch.chunk rows each), saves the result as an
// Ember checkpoint and returns its root.
std::string ImportAndSave(const std::string& dir, const HfLlamaConfig& c, int world, const std::string& root) {
  auto h = HfCheckpoint::Open(dir, c);
  INFO(h.status().ToString());
  REQUIRE(h.ok());
  Model m{LlamaHfLayout(c), {}};
  for (const HfParam& p : m.layout) {
    std::vector<float>& v = m.values[p.name];
    v.resize(static_cast<size_t>(p.shape[0] * p.cols()));
    for (int r = 0; r < world; ++r) {
      auto [b, e] = ShardRows(p.shape[0], r, world);
      REQUIRE((*h)->ReadEmberRows(p.name, b, e - b, v.data() + b * p.cols()).ok());
    }
  }
  return Save(root, m, Records(c));
}

TEST_CASE("export -> import -> export is bitwise equal, single file and sharded", "[hf]") {
  HfLlamaConfig c = TinyConfig();
  SECTION("untied") {}
  SECTION("tied, llama3 rope scaling") {
    c.tie_word_embeddings = true;
    c.rope_scaling.type = "llama3";
  }
  const Model m = RandomModel(c, 2);
  const std::string root = Save(TmpDir("hf_rt_ckpt"), m, Records(c));
  const std::string base = TmpDir("hf_rt");
  for (uint64_t shard : {uint64_t{0}, uint64_t{1500}}) {
    HfExportOptions o;
    o.max_shard_bytes = shard;
    const std::string a = base + "/a" + std::to_string(shard), b = base + "/b" + std::to_string(shard);
    REQUIRE(ExportHf(root, a, o).ok());
    const std::string root2 = ImportAndSave(a, c, 3, base + "/ckpt" + std::to_string(shard));
    REQUIRE(ExportHf(root2, b, o).ok());
    std::vector<std::string> files = {"config.json"};
    if (shard == 0) {
      files.push_back("model.safetensors");
    } else {
      auto index = json::Parse(Slurp(a + "/model.safetensors.index.json"));
      REQUIRE(index.ok());
      const json::Value& wm = index->Get("weight_map");
      CHECK(index->Get("metadata").Get("total_size").as_int() > 1500);
      std::set<std::string> shards;
      for (const auto& [name, f] : wm.object()) shards.insert(f.as_string());
      CHECK(shards.size() > 2);
      for (const std::string& f : shards) {
        CHECK(absl::StrContains(f, absl::StrFormat("-of-%05d.safetensors", shards.size())));
        auto sf = SafetensorsFile::Open(a + "/" + f);
        REQUIRE(sf.ok());
        CHECK((*sf)->metadata().at("format") == "pt");
        files.push_back(f);
      }
      files.push_back("model.safetensors.index.json");
    }
    for (const std::string& f : files) {
      INFO(f);
      CHECK(Slurp(a + "/" + f) == Slurp(b + "/" + f));
      CHECK(!Slurp(a + "/" + f).empty());
    }
    if (c.tie_word_embeddings) CHECK(!HfCheckpoint::Open(a, c).value()->config().rope_scaling.type.empty());
  }
}

TEST_CASE("bf16 and f16 exports round to nearest even and import widened", "[hf]") {
  const HfLlamaConfig c = TinyConfig();
  const Model m = RandomModel(c, 3);
  const std::string root = Save(TmpDir("hf_dt_ckpt"), m, Records(c));
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const std::string out = TmpDir("hf_dt_out") + "/x";
    HfExportOptions o;
    o.dtype = dt;
    REQUIRE(ExportHf(root, out, o).ok());
    auto cfg = json::Parse(Slurp(out + "/config.json"));
    CHECK(cfg->Get("torch_dtype").as_string() == (dt == DType::kBF16 ? "bfloat16" : "float16"));
    auto h = HfCheckpoint::Open(out, c);
    REQUIRE(h.ok());
    const std::vector<float>& w = m.values.at("blocks.0.attn.proj.weight");
    std::vector<float> got(w.size());
    REQUIRE((*h)->ReadEmberRows("blocks.0.attn.proj.weight", 0, 16, got.data()).ok());
    for (size_t i = 0; i < w.size(); ++i) {
      const float want = dt == DType::kBF16 ? base::Bf16ToF32(base::F32ToBf16(w[i]))
                                            : base::F16ToF32(base::F32ToF16(w[i]));
      REQUIRE(got[i] == want);
    }
  }
}

TEST_CASE("import refuses a mismatched config, missing, extra, misshapen and corrupt tensors", "[hf]") {
  const HfLlamaConfig c = TinyConfig();
  const Model m = RandomModel(c, 4);
  const std::string root = Save(TmpDir("hf_bad_ckpt"), m, Records(c));
  const std::string base = TmpDir("hf_bad"), good = base + "/good";
  REQUIRE(ExportHf(root, good, {}).ok());

  HfLlamaConfig other = c;
  other.num_key_value_heads = 4;
  auto s = HfCheckpoint::Open(good, other).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(s.message(), "num_key_value_heads is 2, the job spec has 4 (model.n_kv_heads)"));
  other = c;
  other.rope_theta = 10000.f;
  CHECK(absl::StrContains(HfCheckpoint::Open(good, other).status().message(), "rope_theta is 500000, the job spec has 10000"));
  other = c;
  other.tie_word_embeddings = true;
  CHECK(absl::StrContains(HfCheckpoint::Open(good, other).status().message(), "tie_word_embeddings is false, the job spec has true"));
  other = c;
  other.max_position_embeddings = 64;
  CHECK(absl::StrContains(HfCheckpoint::Open(good, other).status().message(), "below the job spec's model.context_length 64"));
  other.max_position_embeddings = 16;  // a shorter context is fine
  CHECK(HfCheckpoint::Open(good, other).ok());

  // Rewrites the export with tensors changed by `edit`.
  auto rewrite = [&](const std::string& name, auto edit) {
    const std::string dir = base + "/" + name;
    REQUIRE(base::MakeDirs(dir, kDirMode).ok());
    std::ofstream(dir + "/config.json") << Slurp(good + "/config.json");
    auto f = SafetensorsFile::Open(good + "/model.safetensors");
    REQUIRE(f.ok());
    std::vector<TensorSpec> specs;
    std::vector<std::string> data;
    for (const TensorInfo& t : (*f)->tensors()) {
      specs.push_back({t.name, t.dtype, t.shape});
      data.emplace_back((*f)->Data(t));
    }
    edit(specs, data);
    std::vector<absl::string_view> views(data.begin(), data.end());
    REQUIRE(WriteSafetensors(dir + "/model.safetensors", specs, views).ok());
    return dir;
  };
  auto drop = rewrite("missing", [](auto& specs, auto& data) {
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].name == "model.layers.1.mlp.up_proj.weight") {
        specs.erase(specs.begin() + i);
        data.erase(data.begin() + i);
      }
  });
  s = HfCheckpoint::Open(drop, c).status();
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(s.message(), "no tensor 'model.layers.1.mlp.up_proj.weight'"));
  auto extra = rewrite("extra", [](auto& specs, auto& data) {
    specs.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {2}});
    data.push_back(std::string(8, '\0'));
  });
  s = HfCheckpoint::Open(extra, c).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "rotary_emb.inv_freq"));
  auto shape = rewrite("shape", [](auto& specs, auto&) {
    for (auto& t : specs)
      if (t.name == "model.norm.weight") t.shape = {4, 4};
  });
  s = HfCheckpoint::Open(shape, c).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(s.message(), "'model.norm.weight' has shape [4,4], config.json implies [16]"));

  const std::string corrupt = base + "/corrupt";
  REQUIRE(base::MakeDirs(corrupt, kDirMode).ok());
  std::ofstream(corrupt + "/config.json") << Slurp(good + "/config.json");
  const std::string bytes = Slurp(good + "/model.safetensors");
  std::ofstream(corrupt + "/model.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  s = HfCheckpoint::Open(corrupt, c).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "model.safetensors"));
  std::ofstream(corrupt + "/config.json") << "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 16";
  CHECK(absl::StrContains(HfCheckpoint::Open(corrupt, c).status().message(), "config.json"));
  std::ofstream(corrupt + "/config.json") << R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral"})";
  CHECK(absl::StrContains(HfCheckpoint::Open(corrupt, c).status().message(), "not a Llama config"));
  std::ofstream(corrupt + "/config.json") << R"({"model_type": "llama", "vocab_size": 11, "hidden_size": 16,
    "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 4, "attention_bias": true})";
  CHECK(absl::StrContains(HfCheckpoint::Open(corrupt, c).status().message(), "attention_bias: true"));
}

TEST_CASE("export refuses GPT checkpoints and asks for a spec when the checkpoint has no record", "[hf]") {
  const HfLlamaConfig c = TinyConfig();
  const Model m = RandomModel(c, 5);
  const std::string gpt = Save(TmpDir("hf_gpt_ckpt"), m, {{kExtraModelArch, "gpt"}});
  auto s = ExportHf(gpt, TmpDir("hf_gpt_out") + "/x", {}).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(s.message(), "model.arch is 'gpt'"));
  const std::string old = Save(TmpDir("hf_old_ckpt"), m, {});
  s = ExportHf(old, TmpDir("hf_old_out") + "/x", {}).status();
  CHECK(absl::StrContains(s.message(), "--spec"));
  HfExportOptions o;
  o.config = c;  // what --spec supplies
  CHECK(ExportHf(old, TmpDir("hf_old_out") + "/y", o).ok());
  o.config->intermediate_size = 10;
  s = ExportHf(old, TmpDir("hf_old_out") + "/z", o).status();
  CHECK(absl::StrContains(s.message(), "'blocks.0.mlp.fc1.weight' has shape [24,16], the Llama config wants [20,16]"));
}

TEST_CASE("config.json parses what transformers writes for Llama 3.1", "[hf]") {
  auto c = ParseHfConfig(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})", "llama31");
  REQUIRE(c.ok());
  CHECK(c->num_key_value_heads == 8);
  CHECK(c->head_dim() == 128);
  CHECK(c->rope_scaling.type == "llama3");
  CHECK(c->rope_scaling.original_max_position_embeddings == 8192);
  CHECK(c->torch_dtype == DType::kBF16);
  auto back = ParseHfConfig(HfConfigJson(*c), "rewritten");
  REQUIRE(back.ok());
  CHECK(CheckHfConfig(*c, *back, "rewritten").ok());
}

}  // namespace
}  // namespace ember::ckpt
