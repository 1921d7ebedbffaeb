#include "checkpoint/hf_config.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "runtime/base/json.h"
#include "runtime/base/status_macros.h"

namespace ember::ckpt {
namespace {

const char* TorchDtypeName(DType d) {
  switch (d) {
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    default: return "float32";
  }
}

// The shortest decimal that reads back as the same float32 (1e-05, not 9.9999997473787516e-06).
json::Value FloatJson(float f) {
  char buf[32];
  for (int prec = 6; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return json::Value::Double(std::strtod(buf, nullptr));
}

absl::Status Bad(absl::string_view what, absl::string_view field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", field, ": ", why));
}

// An optional number field: `def` when absent or null; a wrong type is an error.
absl::StatusOr<double> Number(const json::Value& o, absl::string_view key, double def,
                              absl::string_view what) {
  const json::Value& v = o.Get(key);
  if (v.is_null()) return def;
  if (!v.is_number()) return Bad(what, key, "not a number");
  return v.as_double();
}

absl::StatusOr<int64_t> Int(const json::Value& o, absl::string_view key, int64_t def,
                            absl::string_view what, bool required) {
  const json::Value& v = o.Get(key);
  if (v.is_null()) {
    if (required) return Bad(what, key, "missing (LlamaForCausalLM needs it)");
    return def;
  }
  if (!v.is_int()) return Bad(what, key, "not an integer");
  return v.as_int();
}

absl::StatusOr<bool> Bool(const json::Value& o, absl::string_view key, bool def, absl::string_view what) {
  const json::Value& v = o.Get(key);
  if (v.is_null()) return def;
  if (!v.is_bool()) return Bad(what, key, "not true/false");
  return v.as_bool();
}

}  // namespace

absl::Status HfLlamaConfig::Validate() const {
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", vocab_size}, {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size}, {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads}, {"num_key_value_heads", num_key_value_heads},
      {"max_position_embeddings", max_position_embeddings}};
  for (const auto& [name, v] : sizes) {
    if (v <= 0) return Bad("llama config", name, absl::StrCat(v, " must be positive"));
  }
  if (hidden_size % num_attention_heads != 0) {
    return Bad("llama config", "hidden_size", absl::StrCat(hidden_size, " is not a multiple of num_attention_heads ", num_attention_heads));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return Bad("llama config", "num_key_value_heads", absl::StrCat(num_key_value_heads, " does not divide num_attention_heads ", num_attention_heads));
  }
  if (head_dim() % 2 != 0) {
    return Bad("llama config", "hidden_size", absl::StrCat("head_dim ", head_dim(), " is odd; RoPE rotates pairs"));
  }
  if (!rope_scaling.type.empty() && rope_scaling.type != "llama3") {
    return Bad("llama config", "rope_scaling", absl::StrCat("type '", rope_scaling.type, "' is not supported; Ember has llama3 or none"));
  }
  return absl::OkStatus();
}

std::string HfConfigJson(const HfLlamaConfig& c) {
  json::Value o = json::Value::MakeObject();
  o.Set("architectures", json::Value::MakeArray().Push(json::Value::Str("LlamaForCausalLM")));
  o.Set("model_type", json::Value::Str("llama"));
  o.Set("vocab_size", json::Value::Int(c.vocab_size));
  o.Set("hidden_size", json::Value::Int(c.hidden_size));
  o.Set("intermediate_size", json::Value::Int(c.intermediate_size));
  o.Set("num_hidden_layers", json::Value::Int(c.num_hidden_layers));
  o.Set("num_attention_heads", json::Value::Int(c.num_attention_heads));
  o.Set("num_key_value_heads", json::Value::Int(c.num_key_value_heads));
  o.Set("head_dim", json::Value::Int(c.head_dim()));
  o.Set("max_position_embeddings", json::Value::Int(c.max_position_embeddings));
  o.Set("rms_norm_eps", FloatJson(c.rms_norm_eps));
  o.Set("rope_theta", FloatJson(c.rope_theta));
  if (c.rope_scaling.type.empty()) {
    o.Set("rope_scaling", json::Value());
  } else {
    json::Value rs = json::Value::MakeObject();
    rs.Set("rope_type", json::Value::Str(c.rope_scaling.type));
    rs.Set("factor", FloatJson(c.rope_scaling.factor));
    rs.Set("low_freq_factor", FloatJson(c.rope_scaling.low_freq_factor));
    rs.Set("high_freq_factor", FloatJson(c.rope_scaling.high_freq_factor));
    rs.Set("original_max_position_embeddings", json::Value::Int(c.rope_scaling.original_max_position_embeddings));
    o.Set("rope_scaling", std::move(rs));
  }
  o.Set("tie_word_embeddings", json::Value::Bool(c.tie_word_embeddings));
  o.Set("hidden_act", json::Value::Str("silu"));
  o.Set("attention_bias", json::Value::Bool(false));
  o.Set("attention_dropout", json::Value::Double(0.0));
  o.Set("mlp_bias", json::Value::Bool(false));
  o.Set("pretraining_tp", json::Value::Int(1));
  o.Set("use_cache", json::Value::Bool(true));
  o.Set("torch_dtype", json::Value::Str(TorchDtypeName(c.torch_dtype)));
  return json::Write(o, 2) + "\n";
}

absl::StatusOr<HfLlamaConfig> ParseHfConfig(absl::string_view text, absl::string_view what) {
  auto parsed = json::Parse(text);
  if (!parsed.ok()) return base::Annotate(parsed.status(), what);
  const json::Value& o = *parsed;
  if (!o.is_object()) return absl::InvalidArgumentError(absl::StrCat(what, ": not a JSON object"));
  bool llama = o.Get("model_type").StrOr() == "llama";
  for (const json::Value& a : o.Get("architectures").array()) llama = llama || a.StrOr() == "LlamaForCausalLM";
  if (!llama) {
    return Bad(what, "architectures", absl::StrCat("not a Llama config (model_type '", o.Get("model_type").StrOr(),
                                                   "'); Ember imports LlamaForCausalLM only"));
  }
  HfLlamaConfig c;
  ASSIGN_OR_RETURN(c.vocab_size, Int(o, "vocab_size", 0, what, true));
  ASSIGN_OR_RETURN(c.hidden_size, Int(o, "hidden_size", 0, what, true));
  ASSIGN_OR_RETURN(c.intermediate_size, Int(o, "intermediate_size", 0, what, true));
  ASSIGN_OR_RETURN(c.num_hidden_layers, Int(o, "num_hidden_layers", 0, what, true));
  ASSIGN_OR_RETURN(c.num_attention_heads, Int(o, "num_attention_heads", 0, what, true));
  ASSIGN_OR_RETURN(c.num_key_value_heads, Int(o, "num_key_value_heads", c.num_attention_heads, what, false));
  ASSIGN_OR_RETURN(c.max_position_embeddings, Int(o, "max_position_embeddings", 2048, what, false));
  ASSIGN_OR_RETURN(double eps, Number(o, "rms_norm_eps", 1e-6, what));
  ASSIGN_OR_RETURN(double theta, Number(o, "rope_theta", 10000.0, what));
  c.rms_norm_eps = static_cast<float>(eps);
  c.rope_theta = static_cast<float>(theta);
  ASSIGN_OR_RETURN(c.tie_word_embeddings, Bool(o, "tie_word_embeddings", false, what));
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    ASSIGN_OR_RETURN(bool b, Bool(o, key, false, what));
    if (b) return Bad(what, key, "true: Ember's Llama has no biases");
  }
  if (std::string act = o.Get("hidden_act").StrOr("silu"); act != "silu") {
    return Bad(what, "hidden_act", absl::StrCat("'", act, "': Ember's Llama MLP is SwiGLU (silu)"));
  }
  if (const json::Value& hd = o.Get("head_dim"); !hd.is_null()) {
    if (!hd.is_int() || c.num_attention_heads <= 0 || hd.as_int() * c.num_attention_heads != c.hidden_size) {
      return Bad(what, "head_dim", absl::StrCat(json::Write(hd), ": Ember needs hidden_size / num_attention_heads = ",
                                                c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0));
    }
  }
  if (const json::Value& rs = o.Get("rope_scaling"); !rs.is_null()) {
    if (!rs.is_object()) return Bad(what, "rope_scaling", "not an object or null");
    c.rope_scaling.type = rs.Get("rope_type").StrOr(rs.Get("type").StrOr());
    if (c.rope_scaling.type != "llama3") {
      return Bad(what, "rope_scaling", absl::StrCat("type '", c.rope_scaling.type, "' is not supported; Ember has llama3 or none"));
    }
    HfRopeScaling& s = c.rope_scaling;
    ASSIGN_OR_RETURN(double f, Number(rs, "factor", s.factor, what));
    ASSIGN_OR_RETURN(double lo, Number(rs, "low_freq_factor", s.low_freq_factor, what));
    ASSIGN_OR_RETURN(double hi, Number(rs, "high_freq_factor", s.high_freq_factor, what));
    ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                     Int(rs, "original_max_position_embeddings", s.original_max_position_embeddings, what, false));
    s.factor = static_cast<float>(f);
    s.low_freq_factor = static_cast<float>(lo);
    s.high_freq_factor = static_cast<float>(hi);
  }
  if (std::string dt = o.Get("torch_dtype").StrOr("float32"); dt == "bfloat16") {
    c.torch_dtype = DType::kBF16;
  } else if (dt == "float16") {
    c.torch_dtype = DType::kF16;
  }
  if (absl::Status st = c.Validate(); !st.ok()) return base::Annotate(st, what);
  return c;
}

absl::Status CheckHfConfig(const HfLlamaConfig& expected, const HfLlamaConfig& found, absl::string_view what) {
  auto mismatch = [&](absl::string_view field, absl::string_view spec_field, const auto& file_v,
                      const auto& spec_v) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", field, " is ", file_v, ", the job spec has ", spec_v, " (", spec_field,
        "); make the spec match the checkpoint"));
  };
  const struct {
    const char* field;
    const char* spec;
    int64_t file, want;
  } ints[] = {
      {"vocab_size", "model.vocab_size", found.vocab_size, expected.vocab_size},
      {"hidden_size", "model.d_model", found.hidden_size, expected.hidden_size},
      {"intermediate_size", "model.mlp_hidden", found.intermediate_size, expected.intermediate_size},
      {"num_hidden_layers", "model.n_layers", found.num_hidden_layers, expected.num_hidden_layers},
      {"num_attention_heads", "model.n_heads", found.num_attention_heads, expected.num_attention_heads},
      {"num_key_value_heads", "model.n_kv_heads", found.num_key_value_heads, expected.num_key_value_heads},
  };
  for (const auto& f : ints) {
    if (f.file != f.want) return mismatch(f.field, f.spec, f.file, f.want);
  }
  if (found.max_position_embeddings < expected.max_position_embeddings) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": max_position_embeddings is ", found.max_position_embeddings,
        ", below the job spec's model.context_length ", expected.max_position_embeddings,
        "; use a context of at most ", found.max_position_embeddings));
  }
  const struct {
    const char* field;
    const char* spec;
    float file, want;
  } floats[] = {
      {"rms_norm_eps", "model.norm_eps", found.rms_norm_eps, expected.rms_norm_eps},
      {"rope_theta", "model.rope_theta", found.rope_theta, expected.rope_theta},
  };
  for (const auto& f : floats) {
    if (f.file != f.want) return mismatch(f.field, f.spec, f.file, f.want);
  }
  if (found.tie_word_embeddings != expected.tie_word_embeddings) {
    return mismatch("tie_word_embeddings", "model.tie_embeddings",
                    found.tie_word_embeddings ? "true" : "false", expected.tie_word_embeddings ? "true" : "false");
  }
  const HfRopeScaling &a = found.rope_scaling, &b = expected.rope_scaling;
  auto type = [](const HfRopeScaling& s) { return s.type.empty() ? std::string("none") : s.type; };
  if (a.type != b.type) return mismatch("rope_scaling.rope_type", "model.rope_scaling.type", type(a), type(b));
  if (!a.type.empty()) {
    if (a.factor != b.factor) return mismatch("rope_scaling.factor", "model.rope_scaling.factor", a.factor, b.factor);
    if (a.low_freq_factor != b.low_freq_factor) {
      return mismatch("rope_scaling.low_freq_factor", "model.rope_scaling.low_freq_factor", a.low_freq_factor, b.low_freq_factor);
    }
    if (a.high_freq_factor != b.high_freq_factor) {
      return mismatch("rope_scaling.high_freq_factor", "model.rope_scaling.high_freq_factor", a.high_freq_factor, b.high_freq_factor);
    }
    if (a.original_max_position_embeddings != b.original_max_position_embeddings) {
      return mismatch("rope_scaling.original_max_position_embeddings", "model.rope_scaling.original_max_position",
                      a.original_max_position_embeddings, b.original_max_position_embeddings);
    }
  }
  return absl::OkStatus();
}

}  // namespace ember::ckpt
