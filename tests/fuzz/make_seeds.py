#!/usr/bin/python3
"""Writes the seed corpora under tests/fuzz/corpus/ (run once; the files are committed).

Protobuf seeds are encoded by hand (field numbers from proto/store*.proto). Every seed is a valid input, so the fuzzer starts from deep paths."""
import json, os, struct, zlib


ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, meta=None):
    header, off, blob = {}, 0, b""
    if meta:
        header["__metadata__"] = meta
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blob += data
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


fixture = os.path.join(os.path.dirname(ROOT), "..", "..", "checkpoint", "testdata", "v1")
put("safetensors", "empty", safetensors([]))
put("safetensors", "one_f32", safetensors([("w", "F32", [2, 2], bytes(16))], {"format": "pt"}))
put("safetensors", "mixed", safetensors([("a", "BF16", [3], bytes(6)), ("b", "I64", [], bytes(8)),
                                          ("c", "U8", [0, 5], b""), ("d", "F16", [1, 1, 2], bytes(4))]))
for f in ("rank-00000.safetensors", "rank-00001.safetensors"):
    put("safetensors", "fixture_" + f, open(os.path.join(fixture, f), "rb").read())
    put("checkpoint_metadata", "fixture_" + f.replace(".safetensors", ".manifest.json"),
        open(os.path.join(fixture, f.replace(".safetensors", ".manifest.json")), "rb").read())
put("checkpoint_metadata", "fixture_metadata.json", open(os.path.join(fixture, "metadata.json"), "rb").read())

examples = os.path.join(os.path.dirname(ROOT), "..", "..", "examples")
for f in sorted(os.listdir(examples)):
    if f.endswith(".yaml"):
        put("spec_yaml", f, open(os.path.join(examples, f), "rb").read())
put("spec_yaml", "minimal.yaml", "name: t\nsteps: 5\n")
put("spec_yaml", "anchors.yaml", "name: a\nmodel: &m {n_layers: 1, d_model: 32, n_heads: 2}\n"
    "optimizer: {lr: 0.001, schedule: cosine, warmup_steps: 2}\nsteps: 3\n")
spec = {"name": "j", "model": {"vocab_size": 256, "context_length": 32, "n_layers": 2, "n_heads": 2,
                               "d_model": 32},
        "data": {"text_path": "data/tiny_corpus.txt"}, "parallelism": {"strategy": "fsdp", "world_size": 2},
        "optimizer": {"lr": 0.003, "schedule": "constant", "grad_clip": 1.0},
        "checkpoint": {"every_steps": 5, "keep_last": 2}, "steps": 20, "batch_size": 4, "seed": 7}
put("spec_json", "full.json", json.dumps(spec, indent=1))
put("spec_json", "compact.json", json.dumps(spec, separators=(",", ":")))
put("spec_json", "minimal.json", '{"name": "t", "steps": 1}')


def frame_wal(payloads):
    return b"".join(struct.pack("<II", len(p), zlib.crc32(p) & 0xFFFFFFFF) + p for p in payloads)


# Protobuf wire encoding by hand (no python protobuf needed): field numbers from proto/store*.proto.
def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def fv(num, n):  # varint field
    return varint(num << 3) + varint(n)


def fb(num, data):  # length-delimited field
    data = data.encode() if isinstance(data, str) else data
    return varint((num << 3) | 2) + varint(len(data)) + data


# WalRecord{revision=1; put=10{key=1,value=2,lease_id=3}; del=11{key=1}; lease_grant=12{id=1,ttl=2};
# lease_revoke=13{id=1}}
payloads = [fv(1, 1) + fb(10, fb(1, "jobs/a/record") + fb(2, b"x" * 40)),
            fv(1, 2) + fb(11, fb(1, "jobs/a/record")),
            fv(1, 3) + fb(12, fv(1, 7) + fv(2, 1000)),
            fv(1, 4) + fb(13, fv(1, 7))]
put("wal", "records", frame_wal(payloads))
put("wal", "torn_tail", frame_wal(payloads)[:-3])
put("wal", "empty_record", frame_wal([b""]))


def frame(p):
    return struct.pack("<I", len(p)) + p


def batch(*ops):  # RequestBatch{requests=1: Request{id=1; <op field>}}
    return frame(b"".join(fb(1, fv(1, i + 1) + op) for i, op in enumerate(ops)))


# fast_path: byte 0 odd = the harness sends a valid handshake first; even = raw bytes.
put("fast_path", "hello_raw", b"\x00" + frame(fb(2, "fuzz-token-0123456789")))
put("fast_path", "bad_token_raw", b"\x00" + frame(fb(2, "wrong")))
put("fast_path", "set_get", b"\x01" + batch(fb(10, fb(1, "k") + fb(2, b"v")), fb(11, fb(1, "k"))))
put("fast_path", "add_cas", b"\x01" + batch(fb(12, fb(1, "n") + fv(2, 5)),
                                             fb(13, fb(1, "n") + fb(2, "5") + fb(4, "6"))))
put("fast_path", "wait_timeout", b"\x01" + batch(fb(14, fb(1, "never") + fv(2, 50)),
                                                  fb(11, fb(1, "never") + fv(2, 1) + fv(3, 50))))
put("fast_path", "multi", b"\x01" + batch(fb(20, fb(1, fb(1, "a") + fb(2, b"1"))),
                                           fb(19, fb(1, "a") + fb(1, "b")), fb(22, fb(1, "")),
                                           fb(18, b""), fb(23, fv(1, 100)), fb(21, fb(1, "a") + fb(2, "z")),
                                           fb(16, fb(1, "a")), fb(17, fb(1, "")), fb(15, fb(1, "a"))))
put("fast_path", "huge_length_raw", b"\x00" + struct.pack("<I", 0x0FFFFFFF) + b"\x0a")
# tcpstore_protocol: byte 0 = piece size (0: the stream whole), then a TCPStore client's bytes.
def ts_str(v):
    v = v if isinstance(v, bytes) else v.encode()
    return struct.pack("<Q", len(v)) + v


def ts_q(t, *args):
    return bytes([t]) + b"".join(a if isinstance(a, bytes) else ts_str(a) for a in args)


TS_MAGIC = struct.pack("<I", 0x3C85F7CE)
V1 = (ts_q(0, "/k", "v") + ts_q(2, "/k") + ts_q(3, "/n", struct.pack("<q", -2)) +
      ts_q(4, struct.pack("<Q", 2), "/a", "/b") + ts_q(5, struct.pack("<Q", 1), "/k") +
      ts_q(1, "/k", "v", "w") + ts_q(8, "/k") + ts_q(6))
V2 = (b"\x00" + TS_MAGIC + ts_q(13, struct.pack("<I", 7)) + ts_q(1, "/k", "v") +
      ts_q(9, "/k", "+") + ts_q(11, struct.pack("<Q", 2), "/x", "1", "/y", "2") +
      ts_q(10, struct.pack("<Q", 2), "/x", "/y") + ts_q(6, struct.pack("<Q", 1), "/z") + ts_q(12) +
      ts_q(4, "/n", struct.pack("<q", 5)) + ts_q(7))
put("tcpstore_protocol", "v1_all", b"\x00" + V1)
put("tcpstore_protocol", "v1_split3", b"\x03" + V1)
put("tcpstore_protocol", "v2_all", b"\x00" + V2)
put("tcpstore_protocol", "v2_split1", b"\x01" + V2)
put("tcpstore_protocol", "v2_validate", b"\x02\x00" + TS_MAGIC)
put("tcpstore_protocol", "v2_half_set", b"\x05\x00" + TS_MAGIC + ts_q(1, "/k", "value")[:-3])
put("tcpstore_protocol", "v1_big_value", b"\x40" + ts_q(0, "/big", b"x" * 3000))

print("seeds written to", ROOT)
