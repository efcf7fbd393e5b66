"""On a CUDA machine: does the GPU decode blobs of every format bit-identically to the CPU, and
how fast? Needs only numpy, numba and this repository (no model, no llama.cpp).

    python -m benchmarks.gpu_check                      # a real GPU: a 4,096-token KV
    NUMBA_ENABLE_CUDASIM=1 python -m benchmarks.gpu_check --tokens 40 --layers 2   # simulator

The KV is the repository's test fixture (real SmolLM2 KV) tiled to [layers, tokens, 192]. A
calibration is fitted on it with the codec alone (keys un-RoPE'd, centred, per-head KLT;
values centred), and each level is encoded on the CPU in 256-token chunks: format 1 (the
model-independent levels) and format 2 (the same bins through the calibration). Every chunk is
decoded with the CPU and the CUDA backends; the output must match to the bit. Prints one JSON
object: per level, identical or not, and decode GB/s of fp16 KV for both backends (median of
--runs, after a warm-up that compiles the kernels). Exits 1 if anything differs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import codec
from codec import Calibration, Part, backend
from codec.calibrated import transform

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "codec" / "real_kv.npz"
LEVELS = ("high", "balanced", "compact")


def kv(layers: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    with np.load(FIXTURE) as z:
        k, v = z["keys"], z["values"]
    reps = (-(-layers // k.shape[0]), -(-tokens // k.shape[1]), 1)
    return tuple(np.ascontiguousarray(np.tile(a, reps)[:layers, :tokens]) for a in (k, v))


def calibration(keys: np.ndarray, values: np.ndarray, head_dim: int = 64) -> Calibration:
    theta = 100000.0 ** (-np.arange(0, head_dim, 2) / head_dim)
    kt = transform.fit(keys[:, 1:], 1, head_dim, "norm", theta, basis=True)
    vt = transform.fit(values[:, 1:], 1, head_dim)
    levels = {}
    for name in LEVELS:
        cfg = codec.levels()[name].get_config()
        for kind in ("keys", "values"):
            cfg[kind] = {**cfg[kind], "transform": "calibrated"}
        levels[name] = cfg
    return Calibration((Part(keys.shape[0], keys.shape[2], kt, vt, levels),),
                       {"made_by": "benchmarks.gpu_check"})


def decode_all(blobs, be, resolver):
    return [codec.decode(b, backend=be, calibrations=resolver) for b in blobs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from codec.backend import cuda

    if not cuda.available():
        print(json.dumps({"error": "no CUDA device (or NUMBA_ENABLE_CUDASIM=1) here"}))
        sys.exit(2)
    cpu, gpu = backend.get("cpu"), backend.get("cuda")
    keys, values = kv(args.layers, args.tokens)
    cal = calibration(keys, values)
    resolver = {cal.id: cal}
    mb = (keys.nbytes + values.nbytes) / 1e9
    report = {"device": str(cuda.cuda.get_current_device().name) if not os.environ.get(
                  "NUMBA_ENABLE_CUDASIM") else "simulator",
              "kv": [args.layers, args.tokens, keys.shape[2]], "levels": {}}
    ok = True
    for name, level, use in [(n, n, None) for n in LEVELS] + [(f"{n}+calibration", n, cal)
                                                              for n in LEVELS]:
        blobs = codec.encode_chunks(keys, values, level, calibration=use, backend=cpu)
        want = decode_all(blobs, cpu, resolver)
        got = decode_all(blobs, gpu, resolver)  # also the warm-up: kernels compile here
        same = all(np.array_equal(a.view(np.uint16), b.view(np.uint16))
                   for w, g in zip(want, got, strict=True) for a, b in zip(w, g, strict=True))
        ok &= same
        row = {"identical": same, "format": codec.peek(blobs[0]).format_version,
               "bits_per_element": round(sum(map(len, blobs)) * 8 / (keys.size * 2), 3)}
        for label, be in (("cpu", cpu), ("cuda", gpu)):
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                decode_all(blobs, be, resolver)
                times.append(time.perf_counter() - t0)
            row[f"{label}_decode_GBps"] = round(mb / statistics.median(times), 3)
        report["levels"][name] = row
        print(json.dumps({name: row}), file=sys.stderr, flush=True)
    report["all_identical"] = bool(ok)
    print(json.dumps(report))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
