#!/usr/bin/python3
"""Outside check of docs/model.md (issue 22): a Llama built from the document alone.

Written from docs/model.md (and docs/job-spec.md for the spec fields) only; it imports nothing
from Ember and reads only the files Ember's test tool writes. For each tiny config it writes a job
spec and a batch, runs `llama_logits --init_seed=S --params_out=P` (Ember's own initialisation,
its loss and logits), and checks
  * the parameters: this file's initialisation from (seed, name) equals Ember's bitwise;
  * the forward pass (float64 here, fp32 in Ember): logits and loss within float32 tolerance.

  model_doc_check.py --llama_logits=PATH --workdir=DIR [--rtol=1e-5]
Exit 0 when every check passes, 1 otherwise.
"""
import argparse
import ctypes
import ctypes.util
import math
import os
import struct
import subprocess
import sys

import numpy as np

M64 = (1 << 64) - 1


# ---- initialisation (docs/model.md, "Initialisation (exact)") ----
def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def fnv1a64(name):
    h = 0xcbf29ce484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001b3) & M64
    return h


def init_param(seed, name, shape, std):
    n = int(np.prod(shape))
    if std == 0.0:
        return np.ones(shape, np.float32)
    key = splitmix64(seed) ^ fnv1a64(name)
    out = np.empty(n, np.float32)
    std = float(std)  # float32 value widened to double
    for i in range(n):
        u1 = ((splitmix64((key + 2 * i) & M64) >> 11) + 0.5) * 2.0 ** -53
        u2 = (splitmix64((key + 2 * i + 1) & M64) >> 11) * 2.0 ** -53
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        out[i] = np.float32(std * z)
    return out.reshape(shape)


def param_specs(c):
    """(name, shape, std) in ParamSpecs order (docs/model.md, Parameters)."""
    C, L, V, H, KV, F = c["C"], c["L"], c["V"], c["H"], c["KV"], c["F"]
    hd = C // H
    std = np.float32(c["init_std"])
    std_out = np.float32(std / np.sqrt(np.float32(2 * L), dtype=np.float32))
    specs = [("wte.weight", (V, C), std)]
    for l in range(L):
        b = "blocks.%d." % l
        specs += [(b + "ln1.weight", (C,), 0.0),
                  (b + "attn.qkv.weight", ((H + 2 * KV) * hd, C), std),
                  (b + "attn.proj.weight", (C, H * hd), std_out),
                  (b + "ln2.weight", (C,), 0.0),
                  (b + "mlp.fc1.weight", (2 * F, C), std),
                  (b + "mlp.fc2.weight", (C, F), std_out)]
    specs.append(("ln_f.weight", (C,), 0.0))
    if not c["tied"]:
        specs.append(("lm_head.weight", (V, C), std))
    return specs


# ---- RoPE tables (docs/model.md, "RoPE") ----
_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_libm.powf.restype = ctypes.c_float
_libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]


def powf(x, y):  # the C library's powf, as the doc says (numpy's float32 power differs in the last bit)
    return np.float32(_libm.powf(float(x), float(y)))


def rope_tables(c, T, tables=False):
    hd = c["C"] // c["H"]
    f32 = np.float32
    theta = f32(c["theta"])
    inv = np.array([f32(1.0) / powf(theta, f32(2 * i) / f32(hd)) for i in range(hd // 2)], f32)
    rs = c.get("llama3")
    if rs:
        rs = dict(dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192), **rs)
        factor, lo, hi, omp = (f32(rs[k]) for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position"))
        low_wavelen = f32(rs["original_max_position"] / rs["low_freq_factor"])
        high_wavelen = f32(rs["original_max_position"] / rs["high_freq_factor"])
        for i in range(hd // 2):
            f = inv[i]
            wavelen = f32(2 * math.pi) / f
            f1 = f / factor if wavelen > low_wavelen else f
            if not (wavelen < high_wavelen) and not (wavelen > low_wavelen):
                smooth = (omp / wavelen - lo) / (hi - lo)
                f1 = (f32(1) - smooth) * f1 / factor + smooth * f1
            inv[i] = f32(f1)
    cos = np.empty((T, hd // 2), f32)
    sin = np.empty((T, hd // 2), f32)
    for t in range(T):
        for i in range(hd // 2):
            a = f32(f32(t) * inv[i])
            cos[t, i] = f32(math.cos(float(a)))
            sin[t, i] = f32(math.sin(float(a)))
    if tables:
        return inv, cos, sin
    return cos.astype(np.float64), sin.astype(np.float64)


def rope(x, cos, sin):  # x [B,T,n,hd], interleaved pairs
    y = np.empty_like(x)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y[..., 0::2] = x0 * c - x1 * s
    y[..., 1::2] = x0 * s + x1 * c
    return y


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def forward(c, P, tokens, targets):
    """float64 forward; returns (loss, logits[B*T, V])."""
    B, T = tokens.shape
    C, H, KV, F, L = c["C"], c["H"], c["KV"], c["F"], c["L"]
    hd, G = C // H, c["H"] // c["KV"]
    eps = float(np.float32(c["norm_eps"]))
    scale = float(np.float32(1.0) / np.sqrt(np.float32(hd), dtype=np.float32))
    cos, sin = rope_tables(c, T)
    W = c.get("window", 0)
    j, t = np.meshgrid(np.arange(T), np.arange(T))
    allowed = (j <= t) & ((t - j < W) if W > 0 else True)
    x = P["wte.weight"][tokens]
    for l in range(L):
        b = "blocks.%d." % l
        a = rmsnorm(x, P[b + "ln1.weight"], eps)
        qkv = a @ P[b + "attn.qkv.weight"].T
        q = qkv[..., :H * hd].reshape(B, T, H, hd)
        k = qkv[..., H * hd:(H + KV) * hd].reshape(B, T, KV, hd)
        v = qkv[..., (H + KV) * hd:].reshape(B, T, KV, hd)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = np.empty((B, T, H, hd))
        for h in range(H):
            g = h // G
            s = np.einsum("btd,bjd->btj", q[:, :, h], k[:, :, g]) * scale
            s = np.where(allowed[None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o[:, :, h] = np.einsum("btj,bjd->btd", s, v[:, :, g])
        x = x + o.reshape(B, T, C) @ P[b + "attn.proj.weight"].T
        m = rmsnorm(x, P[b + "ln2.weight"], eps)
        u = m @ P[b + "mlp.fc1.weight"].T
        ga, gb = u[..., :F], u[..., F:]
        x = x + (ga / (1 + np.exp(-ga)) * gb) @ P[b + "mlp.fc2.weight"].T
    y = rmsnorm(x, P["ln_f.weight"], eps)
    head = P["wte.weight"] if c["tied"] else P["lm_head.weight"]
    z = (y @ head.T).reshape(B * T, -1)
    zmax = z.max(-1, keepdims=True)
    lse = (zmax + np.log(np.exp(z - zmax).sum(-1, keepdims=True)))[:, 0]
    tg = targets.reshape(-1)
    keep = tg != c.get("ignore_index", -100)
    ls, zc = float(np.float32(c.get("label_smoothing", 0.0))), float(np.float32(c.get("z_loss", 0.0)))
    per = (lse - (1 - ls) * z[np.arange(B * T), np.where(keep, tg, 0)] - ls / z.shape[1] * z.sum(-1)
           + zc * lse * lse)
    loss = float(np.mean(per[keep])) if keep.any() else 0.0
    return loss, z


# ---- configs and the comparison ----
CONFIGS = [
    # GQA (KV < H), untied head, default theta.
    dict(name="gqa_untied", V=64, C=32, L=2, H=4, KV=2, tied=False, theta=10000.0, init_std=0.3, B=2, T=16),
    # Tied head, sliding window, multi-query attention, explicit mlp_hidden, loss options.
    dict(name="tied_window", V=48, C=24, L=2, H=3, KV=1, tied=True, window=5, theta=500.0, init_std=0.4,
         mlp_hidden=40, norm_eps=1e-6, ignore_index=3, label_smoothing=0.1, z_loss=1e-3, B=2, T=12),
    # Llama 3.1 frequency scaling with all three bands present at hd = 8 (low/high_freq_factor left
    # to their defaults).
    dict(name="llama3_scaling", V=40, C=32, L=1, H=4, KV=4, tied=False, theta=10000.0, init_std=0.5,
         llama3=dict(factor=6.0, original_max_position=64), B=1, T=40),
]


def complete(c):
    c = dict(c)
    c.setdefault("norm_eps", 1e-5)
    c["F"] = c.get("mlp_hidden") or (8 * c["C"] // 3 + 15) // 16 * 16
    return c


def spec_yaml(c):
    m = ["  arch: llama", "  mlp: swiglu", "  vocab_size: %d" % c["V"], "  context_length: %d" % c["T"],
         "  n_layers: %d" % c["L"], "  n_heads: %d" % c["H"], "  n_kv_heads: %d" % c["KV"], "  d_model: %d" % c["C"],
         "  tie_embeddings: %s" % ("true" if c["tied"] else "false"), "  rope_theta: %r" % c["theta"],
         "  init_std: %r" % c["init_std"], "  norm_eps: %r" % c["norm_eps"]]
    if c.get("mlp_hidden"):
        m.append("  mlp_hidden: %d" % c["mlp_hidden"])
    loss = ["  %s: %r" % (k, c[k]) for k in ("ignore_index", "label_smoothing", "z_loss") if k in c]
    if c.get("window"):
        m.append("  attention_window: %d" % c["window"])
    if c.get("llama3"):
        m.append("  rope_scaling: {type: llama3, %s}" % ", ".join("%s: %r" % kv for kv in c["llama3"].items()))
    return ("name: doccheck\ndata: {text_path: corpus.txt}\nmodel:\n" + "\n".join(m) + "\n" +
            ("loss:\n" + "\n".join(loss) + "\n" if loss else ""))


def check(c, tool, workdir, rtol, seed=7):
    c = complete(c)
    d = os.path.join(workdir, c["name"])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "corpus.txt"), "w") as f:
        f.write("unused\n")
    with open(os.path.join(d, "job.yaml"), "w") as f:
        f.write(spec_yaml(c))
    B, T, V = c["B"], c["T"], c["V"]
    rng = np.random.default_rng(1234)
    tokens = rng.integers(0, V, (B, T)).astype(np.int32)
    targets = rng.integers(0, V, (B, T)).astype(np.int32)
    targets[0, 1] = complete(c).get("ignore_index", -100)  # one ignored target
    targets[-1, 2] = targets[0, 1]
    with open(os.path.join(d, "batch.bin"), "wb") as f:
        f.write(struct.pack("<ii", B, T) + tokens.astype("<i4").tobytes() + targets.astype("<i4").tobytes())
    subprocess.run([tool, "--spec=" + os.path.join(d, "job.yaml"), "--init_seed=%d" % seed,
                    "--batch=" + os.path.join(d, "batch.bin"), "--out=" + os.path.join(d, "out.bin"),
                    "--params_out=" + os.path.join(d, "params.bin"), "--rope_out=" + os.path.join(d, "rope.bin")],
                   check=True, stdout=subprocess.DEVNULL)
    ok = True
    # RoPE frequencies and tables: bitwise.
    mine = np.concatenate([a.reshape(-1) for a in rope_tables(c, T, tables=True)])
    theirs = np.fromfile(os.path.join(d, "rope.bin"), "<f4")
    rope_bad = theirs.size != mine.size or int(np.sum(mine.view(np.uint32) != theirs.view(np.uint32)))
    if rope_bad:
        print("%s: RoPE inv_freq/cos/sin: %s" % (c["name"], "size %d vs %d" % (theirs.size, mine.size) if theirs.size != mine.size
              else "%d of %d values differ (first at %d: doc %r, Ember %r)" % (
                  rope_bad, mine.size, np.argmax(mine != theirs), float(mine[np.argmax(mine != theirs)]),
                  float(theirs[np.argmax(mine != theirs)]))))
        ok = False
    # Parameters: bitwise.
    ember = np.fromfile(os.path.join(d, "params.bin"), "<f4")
    specs = param_specs(c)
    total = sum(int(np.prod(s)) for _, s, _ in specs)
    if ember.size != total:
        print("%s: Ember wrote %d parameters, the doc gives %d" % (c["name"], ember.size, total))
        return False
    P, off, bad = {}, 0, 0
    for name, shape, std in specs:
        n = int(np.prod(shape))
        mine = init_param(seed, name, shape, std)
        theirs = ember[off:off + n].reshape(shape)
        diff = int(np.sum(mine.view(np.uint32) != theirs.view(np.uint32)))
        if diff:
            bad += diff
            print("%s: %s: %d of %d elements differ from Ember's init (first: doc %r, Ember %r)" % (
                c["name"], name, diff, n, float(mine.flat[np.argmax(mine != theirs)]),
                float(theirs.flat[np.argmax(mine != theirs)])))
        P[name] = theirs.astype(np.float64)  # forward on Ember's values so a forward gap shows on its own
        off += n
    ok &= bad == 0
    raw = np.fromfile(os.path.join(d, "out.bin"), "<f4")
    e_loss, e_logits = float(raw[0]), raw[1:].reshape(B * T, V).astype(np.float64)
    loss, logits = forward(c, P, tokens.astype(np.int64), targets.astype(np.int64))
    lerr = np.abs(logits - e_logits).max() / np.abs(logits).max()
    serr = abs(loss - e_loss) / abs(loss)
    good = lerr <= rtol and serr <= rtol
    ok &= good
    print("%s: params %s, RoPE tables %s; logits max|d|/max|z| = %.2e, loss %.8f vs Ember %.8f (rel %.2e) %s" % (
        c["name"], "bitwise equal" if bad == 0 else "DIFFER",
        "bitwise equal" if not rope_bad else "DIFFER", lerr, loss, e_loss, serr, "ok" if good else "FAIL"))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama_logits", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    ok = True
    for c in CONFIGS:
        if not a.only or c["name"] == a.only:
            c = dict(c)
            ok &= check(c, a.llama_logits, a.workdir, a.rtol)
    print("model_doc_check: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
