"""Codec design measurements behind benchmarks/RESULTS.md (Codec section); prints Markdown.

    .venv/bin/python benchmarks/codec_experiments.py [--tokens 2048]

On the recorded default-model KV (benchmarks/record_kv.py), 256-token chunks:
1. anchor/delta coding (CacheGen paper, groups of 10) against plain coding, same bins;
2. the three scale modes at several bin counts (bits per element vs relative RMS error);
3. where the bytes of each named level go, and how far the codebook tables are from the
   empirical entropy of each stream's own histogram (the cost of 2-byte tables).
A measurement script, not part of the codec.
"""

from __future__ import annotations

import argparse

import numpy as np

import codec
from codec import CodecConfig
from codec.bench import load_kv
from codec.kernels.quant import quantize
from codec.kernels.tables import F16_TO_F32
from codec.plan import Plan as _Plan


def config(scale: str, kbins: int, vbins: int, group: int = 0) -> CodecConfig:
    kind = {"scale": scale, "layer_edges": []}
    return CodecConfig.from_config({
        "id": "kvdesk.kv", "name": "x", "mode": "quantized", "lanes": 16, "states": 4,
        "sink_tokens": 0,
        "anchor_group": group, "keys": {**kind, "bins": [kbins]},
        "values": {**kind, "bins": [vbins]}})


def rel(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float32), y.astype(np.float32)
    return float(np.sqrt(((x - y) ** 2).mean() / (x**2).mean()))


def run(keys, values, cfg) -> tuple[float, float, float, list[bytes]]:
    blobs = codec.encode_chunks(keys, values, cfg)
    k2, v2 = codec.decode_chunks(blobs)
    bpe = sum(len(b) for b in blobs) * 8 / (keys.size + values.size)
    return bpe, rel(keys, k2), rel(values, v2), blobs


def empirical_bits(keys, values, cfg: CodecConfig, chunk: int = 256) -> float:
    """Sum over streams of n * H(stream histogram): a coder with free, exact tables."""
    total = 0.0
    for arr, kind in ((keys, cfg.keys), (values, cfg.values)):
        for i in range(0, arr.shape[1], chunk):
            first = max(cfg.sink_tokens - i, 0)
            bits = np.ascontiguousarray(arr[:, i + first:i + chunk]).view(np.uint16)
            plan = _Plan.of(kind, bits.shape[0], bits.shape[1], bits.shape[2], 0)
            _, _, hist, _ = quantize(bits, plan.maxq, plan.akey, plan.bkey, plan.n_a, plan.n_b,
                                     F16_TO_F32)
            p = hist / np.maximum(hist.sum(axis=2, keepdims=True), 1)
            total += float(-(hist * np.log2(np.where(p > 0, p, 1))).sum())
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    args = ap.parse_args()
    keys, values, source = load_kv(None)
    keys, values = keys[:, :args.tokens], values[:, :args.tokens]
    print(f"KV {keys.shape}, {source}\n")

    print("### Anchor/delta vs plain (same bins, anchor every 10th token)\n")
    print("| scale, K/V bins | plain bits/elem | plain rel. err K / V "
          "| delta bits/elem | delta rel. err K / V |")
    print("|---|---|---|---|---|")
    for scale, kb, vb in (("token", 32, 32), ("token", 16, 16), ("layer", 16, 12),
                          ("layer", 32, 24)):
        p = run(keys, values, config(scale, kb, vb))
        d = run(keys, values, config(scale, kb, vb, group=10))
        print(f"| {scale}, {kb}/{vb} | {p[0]:.3f} | {p[1]:.3f} / {p[2]:.3f} | {d[0]:.3f} "
              f"| {d[1]:.3f} / {d[2]:.3f} |")

    print("\n### Scale modes (same bins for K and V, no sinks)\n")
    print("| scale | bins | bits/elem | rel. err K | rel. err V |")
    print("|---|---|---|---|---|")
    for scale, bins in (("token", (8, 16, 32)), ("channel", (6, 8, 16)),
                        ("layer", (12, 16, 24, 32))):
        for b in bins:
            r = run(keys, values, config(scale, b, b))
            print(f"| {scale} | {b} | {r[0]:.3f} | {r[1]:.3f} | {r[2]:.3f} |")

    print("\n### Where the bytes go, per named level (% of blob bytes)\n")
    print("| level | bits/elem | rel. err K / V | header | counts | sinks | scales | tables "
          "| streams | streams vs empirical entropy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, cfg in codec.levels().items():
        bpe, ek, ev, blobs = run(keys, values, cfg)
        parts: dict[str, int] = {}
        for b in blobs:
            for part, n in codec.layout(b).items():
                parts[part] = parts.get(part, 0) + n
        total = sum(parts.values())
        share = " | ".join(f"{100 * parts[p] / total:.2f}" for p in (
            "header", "counts", "sinks", "scales", "tables", "streams"))
        model = "n/a (explicit tables)"
        if cfg.mode == "quantized":
            model = f"+{100 * (parts['streams'] * 8 / empirical_bits(keys, values, cfg) - 1):.1f}%"
        print(f"| {name} | {bpe:.3f} | {ek:.3f} / {ev:.3f} | {share} | {model} |")


if __name__ == "__main__":
    main()
