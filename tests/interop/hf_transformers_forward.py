"""Hugging Face transformers' own LlamaForCausalLM on an Ember export (hf_interop_test).

    $EMBER_PEERS_VENV/bin/python hf_transformers_forward.py HF_DIR BATCH OUT

Loads HF_DIR with transformers.AutoModelForCausalLM.from_pretrained (config.json, model.safetensors
or the sharded set and its index, all read by transformers and safetensors themselves) in float32
with eager attention, on the CPU, and writes the same OUT as hf_llama_reference.py: float32 loss
(mean cross-entropy of the logits against BATCH's targets, ignoring -100, as
hf_llama_reference.py computes it) then logits[B*T, V]. Fails when transformers
reports missing, unexpected or mismatched weights. Run under the peers venv (deploy/peers-venv.sh).

BATCH: little-endian int32 B, T, tokens[B*T], targets[B*T].
"""
import struct
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    hf_dir, batch_path, out_path = sys.argv[1:4]
    torch.set_num_threads(1)
    model, info = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"from_pretrained({hf_dir}) loading info is not clean: {bad}")
    if type(model).__name__ != "LlamaForCausalLM":
        sys.exit(f"from_pretrained({hf_dir}) made a {type(model).__name__}, want LlamaForCausalLM")
    model.eval()
    with open(batch_path, "rb") as f:
        raw = f.read()
    B, T = struct.unpack("<ii", raw[:8])
    ids = torch.frombuffer(bytearray(raw[8:]), dtype=torch.int32).long()
    tokens, targets = ids[: B * T].view(B, T), ids[B * T:].view(B, T)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                 ignore_index=-100)
    with open(out_path, "wb") as f:
        f.write(struct.pack("<f", loss.item()))
        f.write(logits.contiguous().view(-1).numpy().astype("<f4").tobytes())
    print(f"transformers {transformers.__version__} torch {torch.__version__}: loss {loss.item():.9g}")


if __name__ == "__main__":
    main()
