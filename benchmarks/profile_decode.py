"""Where a level's decode spends its cycles, piece by piece, beside a copy of its output bytes.

    .venv/bin/python -m benchmarks.profile_decode --kv benchmarks/data/kv4096.npz \
        [--calibration cal.kvcl] [--levels balanced] [--runs 5]

Each piece of `codec.decode` runs alone on the same blobs (256-token chunks of the whole KV),
with numba held to one thread, and is timed in process CPU seconds (minimum of --runs, in ms
per document), so other work on a shared machine changes the figures little: end-to-end
decode (fresh outputs, and into an engine-like buffer with V channel-major), blob parsing
with the CRC-32, the decoder's table rows and dequantization tables, RoPE angles, the rANS
kernel fused with dequantization (token-major output, then V channel-major through the tile),
the inverse transform of calibrated kinds (on the kernel's real coefficients), and a numpy
copy of the decoded bytes into a destination that is never in cache. A measurement script,
not part of the codec: it calls the pipeline's private pieces in the order `decode` does.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numba
import numpy as np

import codec
from codec import backend, pipeline
from codec.bench import load_kv
from codec.calibrated import transform
from codec.kernels import rans
from codec.plan import Plan


def best_ms(step, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.process_time()
        step()
        times.append(time.process_time() - t)
    return round(min(times) * 1e3, 2)


def kernel_calls(blobs: list[bytes], cal: codec.Calibration | None) -> list[dict]:
    """The rANS decoder's arguments for every kind of every blob, as `pipeline.decode` makes
    them, and the inverse transform's where the kind has one."""
    calls = []
    for blob in blobs:
        parts = pipeline._parse(blob)
        h = parts.header
        cfg = h.config
        n_sink = pipeline._n_sink(cfg, h.first_token, h.n_tokens)
        cal_part = pipeline._part(cfg, cal, h.n_layer, h.channels)
        for i, kind in enumerate((cfg.keys, cfg.values)):
            plan = Plan.of(kind, h.n_layer, h.n_tokens - n_sink, h.channels,
                           cfg.anchor_group)
            bank, base = plan.bank
            ent = parts.tables[i] + base[:, None]
            rows, fc, lut = bank.decoder_tables(ent)
            dq = plan.dequant(parts.scales[i])
            call = {"plan": plan, "scales": parts.scales[i], "bank": bank, "ent": ent,
                    "tf": None, "first": h.first_token + n_sink, "n": h.n_tokens - n_sink}
            if kind.transform:
                dq = dq.view(np.float16).astype(np.float32)
                out = np.empty((h.n_layer, h.n_tokens - n_sink, h.channels), np.float32)
                call["tf"] = cal_part.transform(("keys", "values")[i])
                t0 = 0
            else:
                out = np.empty((h.n_layer, h.n_tokens, h.channels), np.uint16)
                t0 = n_sink
            call["args"] = [parts.words[i], parts.counts[i], rows, fc, lut,
                            np.ascontiguousarray(dq), plan.akey, plan.bkey, out, t0, cfg.lanes,
                            cfg.states]
            calls.append(call)
    return calls


def profile(keys, values, level: str, cal, runs: int) -> dict:
    blobs = codec.encode_chunks(keys, values, level, calibration=cal)
    resolver = {cal.id: cal} if cal else None
    calls = kernel_calls(blobs, cal)
    n_layer, n_tok, n_ch = keys.shape
    doc_k = np.empty_like(keys)
    doc_v = np.empty((n_layer, n_ch, n_tok), values.dtype).transpose(0, 2, 1)

    def engine():
        at = 0
        for b in blobs:
            n = codec.peek(b).n_tokens
            codec.decode(b, out=(doc_k[:, at:at + n], doc_v[:, at:at + n]), calibrations=resolver)
            at += n

    def kernel(which, channel_major=False):
        def run():
            for c in calls[which::2]:
                a = c["args"]
                out = a[8]
                if channel_major:
                    out = c.setdefault("cm", np.empty((out.shape[0], out.shape[2], out.shape[1]),
                                                      out.dtype).transpose(0, 2, 1))
                assert rans.decode(*a[:8], out, *a[9:])
        return run

    coefs = [(c, np.empty_like(c["args"][8]), np.empty(c["args"][8].shape, np.uint16),
              transform.angles(c["tf"], c["first"], c["n"])) for c in calls if c["tf"]]

    def untransform():
        spent = 0.0
        for c, coef, out, (cos, sin) in coefs:
            np.copyto(coef, c["args"][8])  # the kernel overwrites its input: not timed
            tf = c["tf"]
            t = time.process_time()
            backend.jit().untransform(coef, out, tf, cos, sin)
            spent += time.process_time() - t
        return spent

    src = np.ones((keys.size + values.size), np.uint16)
    dst = np.zeros_like(src)
    def fresh():
        for b in blobs:  # each chunk's arrays freed before the next, as a restore does
            codec.decode(b, calibrations=resolver)

    pieces = {
        "decode": fresh,
        "decode_engine": engine,
        "parse_crc": lambda: [pipeline._parse(b) for b in blobs],
        "table_rows": lambda: [c["bank"].decoder_tables(c["ent"]) for c in calls],
        "dequant_tables": lambda: [c["plan"].dequant(c["scales"]) for c in calls],
        "rope_angles": lambda: [transform.angles(c["tf"], c["first"], c["n"])
                                for c in calls if c["tf"]],
        "rans_keys": kernel(0), "rans_values": kernel(1),
        "rans_values_channel_major": kernel(1, True),
        "memcpy": lambda: np.copyto(dst, src),
    }
    for c in calls:  # warm-up: JIT caches, tables, pages of every output
        assert rans.decode(*c["args"])
    engine()
    ms = {name: best_ms(step, runs) for name, step in pieces.items()}
    untransform()
    ms["inverse_transform"] = round(min(untransform() for _ in range(runs)) * 1e3, 2)
    n_sym = sum(c["args"][8][:, c["args"][9]:].size for c in calls)
    rans_ms = ms["rans_keys"] + ms["rans_values"]
    return {"ms_per_document": ms, "bits_per_element": round(
                sum(map(len, blobs)) * 8 / (keys.size + values.size), 4),
            "symbols": n_sym, "rans_ns_per_symbol": round(rans_ms * 1e6 / n_sym, 2),
            "decode_vs_memcpy_cpu": round(ms["memcpy"] / ms["decode"], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", type=Path)
    ap.add_argument("--calibration", type=Path)
    ap.add_argument("--levels", default="balanced")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    keys, values, source = load_kv(args.kv)
    cal = codec.Calibration.from_bytes(args.calibration.read_bytes()) if args.calibration else None
    numba.set_num_threads(1)
    load = os.getloadavg()[0]
    out = {}
    for name in args.levels.split(","):
        out[name] = profile(keys, values, name, None, args.runs)
        if cal and name in cal.level_names:
            out[f"{name}@calibrated"] = profile(keys, values, name, cal, args.runs)
    print(json.dumps({"levels": out, "kv": {"shape": list(keys.shape), "source": source},
                      "threads": 1, "loadavg_1min": [round(load, 2),
                                                     round(os.getloadavg()[0], 2)]}))


if __name__ == "__main__":
    main()
