#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ from the project's own inputs.

config:     experiments/**/base.json and the config tests' bad inputs (tests/core_config), some with
            "--set" override lines.
sweep_spec: experiments/**/*.json sweep specs (a base path inlined) and the JSON literals of
            tests/sweeps/spec_test.cc, completed as its Spec() helper completes them.
documents:  text and JSON Lines documents as in tests/core_data/input_test.cc, plain, gzip and
            zstd (the `zstd` command), with the mode byte the target expects.
checkpoint: format 1 and 2 checkpoints as core/train/checkpoint.cc writes them (the sizes byte
            prefix the target expects), a truncated and a damaged one.

Deterministic; rerun after changing a format and commit the result. Files that the fuzzer found
and minimised are kept next to these (named crash-*/regress-*) and are not touched.
"""
import gzip
import json
import pathlib
import re
import struct
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def config_seeds():
    for p in sorted(ROOT.glob("experiments/**/base.json")):
        write("config", "exp-" + "-".join(p.relative_to(ROOT / "experiments").parts), p.read_text())
    bad = [
        '{"model": {"head": 4}}', '{"modle": {"heads": 4}}',
        '{"optimizer": {"learning_rate": 1e-3}}', '{"model": {"experts_total": 8}}',
        '{"model": {"layers": "four"}}', '{"model": {"layers": 2.5}}',
        '{"model": {"tie_embeddings": 1}}', '{"optimizer": {"lr": "fast"}}',
        '{"optimizer": {"no_decay": ["norm", 3]}}', '{"model": 3}',
        '{"moe": {"router": "softmx"}}', '{"model": {"d_model": 100, "heads": 3}}',
        '{"model": {"heads": 4, "kv_heads": 3}}', '{"model": {"heads": 4, "kv_heads": 8}}',
        '{"moe": {"experts_total": 4, "experts_active": 6}}',
        '{"moe": {"experts_total": 4, "dense_layers": 9}}',
        '{"model": {"d_model": 96, "heads": 32}}',
        '{"model": {"qk_norm": true}, "optimizer": {"qk_clip_tau": 30}}',
        '{"model": {"qk_norm": true, "attention": "mla"}}', '{"optimizer": {"name": "muonclip"}}',
        '{"optimizer": {"no_decay": ["norms"]}}',
        '{"train": {"steps": 10}, "schedule": {"warmup_steps": 10}}',
        '{"data": {"source": "markov", "markov_order": 4}, "model": {"vocab_size": 4096}}',
        '{"train": {"tokens": 3e6, "batch_size": 8, "seed": 18446744073709551615}, '
        '"model": {"seq_len": 256}}',
        '{"train": {"device": "cuda", "precision": "bf16"}, "dist": {"expert_parallel": 2}, '
        '"moe": {"experts_total": 4}}',
        '// a comment\n{"name": "x", "description": "y", "optimizer": {"adamw_lr": -1.0}}',
    ]
    for i, text in enumerate(bad):
        write("config", f"test-bad-{i:02d}.json", text)
    write("config", "set-overrides.json",
          '--set model.layers=6\n--set optimizer.name=muon\n--set model.tie_embeddings=true\n'
          '--set optimizer.no_decay=["norm"]\n{}')
    write("config", "set-bad.json", '--set model.layer=6\n--set noequals\n{"model": {}}')


SPEC_BASE = {
    "model": {"vocab_size": 64, "d_model": 32, "layers": 2, "heads": 2, "ffn_hidden": 64,
              "seq_len": 16},
    "moe": {"experts_total": 4, "experts_active": 2, "expert_hidden": 16},
    "data": {"source": "markov"},
    "train": {"batch_size": 2, "steps": 20, "threads": 1},
    "schedule": {"warmup_steps": 2},
}


def sweep_seeds():
    for p in sorted(ROOT.glob("experiments/**/*.json")):
        spec = json.loads(p.read_text())
        if not isinstance(spec, dict) or "base" not in spec:
            continue
        if isinstance(spec["base"], str):
            spec["base"] = json.loads((p.parent / spec["base"]).read_text())
        spec.setdefault("name", p.stem)
        write("sweep_spec", "exp-" + "-".join(p.relative_to(ROOT / "experiments").parts),
              json.dumps(spec, indent=1))
    text = (ROOT / "tests" / "sweeps" / "spec_test.cc").read_text()
    n = 0
    for literal in re.findall(r'R"\((.*?)\)"', text, re.S):
        try:
            spec = json.loads(literal)
        except json.JSONDecodeError:
            continue
        if not isinstance(spec, dict) or "model" in spec:
            continue
        spec.setdefault("name", "t")
        spec.setdefault("base", SPEC_BASE)
        write("sweep_spec", f"test-{n:02d}.json", json.dumps(spec))
        n += 1


def documents_seeds():
    words = ["moe", "expert", "router", "token", "head", "logit", "clip", "muon", "adam", "loss"]
    docs = []
    for i in range(40):
        d = " ".join(words[(i * 7 + w * 3) % 10] for w in range(5 + i % 11))
        if i % 10 == 0:
            d += '\nsecond line "quoted"\tcaf\u00e9'
        docs.append(d)
    plain = "\r\n".join(d.replace("\n", " ") for d in docs[:20]) + "\n\nlast line without newline"
    jsonl = "".join(json.dumps({"id": i, "text": d}) + ("\n\n" if i % 7 == 0 else "\n")
                    for i, d in enumerate(docs))
    bad_jsonl = '{"text": "ok"}\n[1, 2]\n{"content": "no text"}\n{"text": 3}\n{"text": ""}\n{bad'

    def zstd(b):
        return subprocess.run(["zstd", "-q", "-c", "-3"], input=b, capture_output=True,
                              check=True).stdout

    def gz(b):
        return gzip.compress(b, mtime=0)

    # Mode byte: 0 text, 1 text.gz, 2 text.zst, 3 jsonl, 4 jsonl.gz, 5 jsonl.zst.
    for name, mode, body in [
        ("text", 0, plain.encode()), ("text-gz", 1, gz(plain.encode())),
        ("text-zst", 2, zstd(plain.encode())), ("jsonl", 3, jsonl.encode()),
        ("jsonl-gz", 4, gz(jsonl.encode()) + gz(b'{"text": "second member"}\n')),
        ("jsonl-zst", 5, zstd(jsonl.encode()) + zstd(b'{"text": "second frame"}')),
        ("jsonl-bad", 3, bad_jsonl.encode()), ("gz-truncated", 1, gz(plain.encode())[:40]),
        ("zst-truncated", 5, zstd(jsonl.encode())[:30]),
    ]:
        write("documents", name, bytes([mode]) + body)


def fnv1a(b):
    h = 1469598103934665603
    for c in b:
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def checkpoint_file(fmt, params, bias, buffers, uuid="0123456789abcdef"):
    def s(v):
        return struct.pack("<Q", len(v)) + v.encode()

    def floats(v):
        return struct.pack("<Q", len(v)) + struct.pack(f"<{len(v)}f", *v)

    b = b"MOECKPT%d" % fmt + s("c" * 64) + s("b" * 64)
    if fmt >= 2:
        b += s(uuid)
    b += struct.pack("<qqd", 7, 7 * 32, 1.5e9)
    b += floats(params) + floats(bias) + struct.pack("<Q", len(buffers))
    for name, v in buffers:
        b += s(name) + floats(v)
    return b + struct.pack("<Q", fnv1a(b))


def checkpoint_seeds():
    params = [0.5 * i for i in range(8)]
    bias = [0.25, -0.25]
    buffers = [("b0", [1.0] * 8), ("b1", [2.0] * 8)]
    sizes = bytes([8, 2, 2])  # the target's model: 8 parameters, 2 router biases, 2 buffers
    v2 = checkpoint_file(2, params, bias, buffers)
    v1 = checkpoint_file(1, params, bias, buffers)
    write("checkpoint", "format2", b"\x00" + sizes + v2)
    write("checkpoint", "format2-fix-sum", b"\x01" + sizes + v2)
    write("checkpoint", "format2-branch", b"\x02" + sizes + v2)
    write("checkpoint", "format1", b"\x00" + sizes + v1)
    write("checkpoint", "format2-no-buffers", b"\x01" + bytes([8, 2, 0]) +
          checkpoint_file(2, params, bias, []))
    write("checkpoint", "truncated", b"\x00" + sizes + v2[: len(v2) // 2])
    damaged = bytearray(v2)
    damaged[100] ^= 0x40
    write("checkpoint", "damaged", b"\x00" + sizes + bytes(damaged))
    write("checkpoint", "foreign-uuid", b"\x01" + sizes + checkpoint_file(2, params, bias, buffers,
                                                                           "fedcba9876543210"))


if __name__ == "__main__":
    config_seeds()
    sweep_seeds()
    documents_seeds()
    checkpoint_seeds()
