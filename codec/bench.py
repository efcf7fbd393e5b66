"""`python -m codec.bench [--json]`: encode/decode speed and size of every level on real KV.

The KV is the default model's (SmolLM2-135M, 30 layers x 192 channels) over 4,096 tokens, as
recorded by `benchmarks/record_kv.py` into benchmarks/data/kv4096.npz. Without that file the
committed test fixture (a few layers, a few hundred tokens of the same model) is tiled up to
that shape, and the output says so. Documents are encoded in 256-token chunks and decoded
chunk by chunk, as the engine does; MB/s are of fp16 KV (2 bytes per element), medians of
several runs after a warm-up. A benchmark, not a test: it must never assert speed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from . import decode, encode_chunks, levels
from .backend import active

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "benchmarks" / "data" / "kv4096.npz"
FIXTURE = ROOT / "tests" / "fixtures" / "codec" / "real_kv.npz"
SHAPE = (30, 4096, 192)


def load_kv(path: Path | None) -> tuple[np.ndarray, np.ndarray, str]:
    """(keys, values, a sentence saying where they came from)."""
    for candidate in [path] if path else [RECORDED]:
        if candidate.exists():
            with np.load(candidate) as z:
                return z["keys"], z["values"], f"recorded KV {candidate.name}"
    with np.load(FIXTURE) as z:
        k, v = z["keys"], z["values"]
    reps = (-(-SHAPE[0] // k.shape[0]), -(-SHAPE[1] // k.shape[1]), 1)
    tile = [np.ascontiguousarray(np.tile(a, reps)[:, :SHAPE[1]][:SHAPE[0]]) for a in (k, v)]
    return tile[0], tile[1], (f"fixture {FIXTURE.name} {k.shape} tiled to {SHAPE} "
                              f"(run benchmarks/record_kv.py for a real 4,096-token KV)")


def measure(keys: np.ndarray, values: np.ndarray, level: str, runs: int) -> dict:
    mb = (keys.nbytes + values.nbytes) / 1e6
    blobs = encode_chunks(keys, values, level)  # warm-up: JIT caches, codebooks
    for b in blobs:
        decode(b)
    enc, dec = [], []
    for _ in range(runs):
        t = time.perf_counter()
        blobs = encode_chunks(keys, values, level)
        enc.append(time.perf_counter() - t)
        t = time.perf_counter()
        for b in blobs:
            decode(b)
        dec.append(time.perf_counter() - t)
    size = sum(len(b) for b in blobs)
    # The best run shows what the kernels can do when the shared machine is quiet.
    return {"encode_MBps": round(mb / float(np.median(enc)), 1),
            "decode_MBps": round(mb / float(np.median(dec)), 1),
            "bits_per_element": round(size * 8 / (keys.size + values.size), 4),
            "bytes": size,
            "encode_MBps_best": round(mb / min(enc), 1),
            "decode_MBps_best": round(mb / min(dec), 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m codec.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--kv", type=Path, help="an .npz with keys and values [L, T, C] float16")
    ap.add_argument("--levels", default=",".join(levels()), help="comma-separated level names")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    keys, values, source = load_kv(args.kv)
    load_before = os.getloadavg()[0]
    result = {"levels": {name: measure(keys, values, name, args.runs)
                         for name in args.levels.split(",")},
              "kv": {"shape": list(keys.shape), "source": source},
              "backend": active().name, "runs": args.runs,
              # other work on the machine shows here, and in MB/s far below the kernels'
              "loadavg_1min": {"before": round(load_before, 2),
                               "after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}}
    if args.json:
        print(json.dumps(result))
        return
    load = result["loadavg_1min"]
    print(f"KV {keys.shape} from {source}; backend {result['backend']}; median of {args.runs}; "
          f"load average {load['before']} -> {load['after']} on {load['cpus']} CPUs")
    print(f"{'level':<12} {'encode MB/s':>12} {'decode MB/s':>12} {'bits/elem':>10}   "
          f"(best run: encode, decode)")
    for name, r in result["levels"].items():
        print(f"{name:<12} {r['encode_MBps']:>12} {r['decode_MBps']:>12} "
              f"{r['bits_per_element']:>10}   ({r['encode_MBps_best']}, {r['decode_MBps_best']})")


if __name__ == "__main__":
    main()
