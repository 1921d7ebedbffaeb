#!/usr/bin/python3
"""An independent Hugging Face LlamaForCausalLM forward pass in plain PyTorch (hf_interop_test).

    /usr/bin/python3 hf_llama_reference.py HF_DIR BATCH OUT

Reads HF_DIR the way transformers does (config.json; model.safetensors or the sharded set named by
model.safetensors.index.json, parsed here by hand) and computes what transformers' modeling_llama
computes, in float32: rotate_half RoPE (with the llama3 frequency rule of
_compute_llama3_parameters when rope_scaling asks), grouped-query attention through repeat_kv,
RMSNorm, SwiGLU, the LM head (tied to embed_tokens when tie_word_embeddings), and the mean
cross-entropy ignoring -100. Written from transformers' code, not from Ember's docs.

BATCH: little-endian int32 B, T, tokens[B*T], targets[B*T]. OUT: float32 loss, logits[B*T, V].
"""
import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2)}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    assert meta.get("format") == "pt", f"{path}: __metadata__.format is {meta.get('format')!r}, want 'pt'"
    base = 8 + n
    out = {}
    for name, t in header.items():
        dtype, size = DTYPES[t["dtype"]]
        b, e = t["data_offsets"]
        raw = bytearray(data[base + b:base + e])
        if dtype == torch.bfloat16:  # frombuffer has no bfloat16 in torch 1.13: go through int16
            w = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16)
        else:
            w = torch.frombuffer(raw, dtype=dtype)
        out[name] = w.reshape(t["shape"]).to(torch.float32)
    return out


def load(hf_dir):
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    weights = {}
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        for shard in sorted(set(weight_map.values())):
            weights.update(read_safetensors(os.path.join(hf_dir, shard)))
        assert set(weights) == set(weight_map), "index and shards disagree"
    else:
        weights = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    return cfg, weights


def inv_freq_of(cfg, head_dim):
    base = float(cfg.get("rope_theta", 10000.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rs = cfg.get("rope_scaling")
    if rs is None:
        return inv_freq
    assert rs.get("rope_type", rs.get("type")) == "llama3"
    # transformers.modeling_rope_utils._compute_llama3_parameters
    factor = rs["factor"]
    low_freq_factor = rs["low_freq_factor"]
    high_freq_factor = rs["high_freq_factor"]
    old_context_len = rs["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def forward(cfg, w, tokens):
    B, T = tokens.shape
    C = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", C // H)
    eps = cfg["rms_norm_eps"]
    inv_freq = inv_freq_of(cfg, hd)
    position_ids = torch.arange(T)[None, :].float()
    freqs = (inv_freq[None, :, None] @ position_ids[:, None, :]).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # [1, 1, T, hd]
    mask = torch.full((T, T), float("-inf")).triu(1)

    x = w["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, hd).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // KV), repeat_kv(v, H // KV)
        scores = (q @ k.transpose(2, 3)) * hd ** -0.5 + mask
        o = torch.softmax(scores, dim=-1, dtype=torch.float32) @ v
        o = o.transpose(1, 2).reshape(B, T, H * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return x @ head.T


def main():
    hf_dir, batch_path, out_path = sys.argv[1:4]
    torch.set_num_threads(1)
    cfg, w = load(hf_dir)
    with open(batch_path, "rb") as f:
        raw = f.read()
    B, T = struct.unpack("<ii", raw[:8])
    ids = torch.frombuffer(bytearray(raw[8:]), dtype=torch.int32).long()
    tokens, targets = ids[: B * T].view(B, T), ids[B * T:].view(B, T)
    with torch.no_grad():
        logits = forward(cfg, w, tokens)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1),
                                                 ignore_index=-100)
    with open(out_path, "wb") as f:
        f.write(struct.pack("<f", loss.item()))
        f.write(logits.contiguous().view(-1).numpy().astype("<f4").tobytes())
    print(f"loss {loss.item():.9g}")


if __name__ == "__main__":
    main()
