"""Decode time of the calibrated transforms at equal bins: what each costs a restore.

    .venv/bin/python -m benchmarks.transform_decode --kv benchmarks/data/kv4096.npz --level high

The recorded KV is encoded in 256-token chunks at one level's bins (the default `high` unless
--level) with each transform variant (fitted on the KV's first half; SmolLM2's RoPE), then
decoded --repeat times; the best process CPU and wall seconds of a whole-document decode are
printed per variant with the ratio to plain decoding, and the bits per element at those bins
(a sanity check only, half of it on the transforms' own fitting data: what a transform pays
is measured by the calibration and benchmarks.bench_quality).
Variants: plain (no calibration), centred (keys un-RoPE'd and centred, values centred),
klt-float (the float32 per-head inverse of format version 1 calibrations), klt (per-head,
exact), pca (one layer-wide basis for the keys, exact), pca-kv (the values' too).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import codec
from codec.calibrated import transform
from codec.calibrated.calibration import Calibration, Part

VARIANTS = ("plain", "centred", "klt-float", "klt", "pca", "pca-kv")


def calibration(keys, values, variant: str, level: str, head_dim: int = 64) -> Calibration:
    half = keys.shape[1] // 2
    theta = 100000.0 ** (-np.arange(0, head_dim, 2) / head_dim)
    n_ch = keys.shape[2]
    block = {"klt-float": None, "klt": head_dim, "pca": n_ch, "pca-kv": n_ch}.get(variant)
    kt = transform.fit(keys[:, 1:half], 1, head_dim, "norm", theta, basis=block is not None
                       or variant == "klt-float", block=block, exact=block is not None)
    vt = transform.fit(values[:, 1:half], 1, head_dim, basis=variant == "pca-kv", block=block,
                       exact=variant == "pca-kv")
    cfg = codec.levels()[level].get_config()
    for kind in ("keys", "values"):
        cfg[kind] = {**cfg[kind], "transform": "calibrated"}
    return Calibration((Part(keys.shape[0], n_ch, kt, vt, {level: cfg}),))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", required=True)
    ap.add_argument("--level", default="high")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    with np.load(args.kv) as z:
        keys, values = np.ascontiguousarray(z["keys"]), np.ascontiguousarray(z["values"])
    rows = []
    for variant in args.variants.split(","):
        cal = None if variant == "plain" else calibration(keys, values, variant, args.level)
        blobs = codec.encode_chunks(keys, values, args.level, calibration=cal)
        resolver = {cal.id: cal} if cal else None
        codec.decode_chunks(blobs, calibrations=resolver)  # compile, fault in the scratch
        cpu, wall = [], []
        for _ in range(args.repeat):
            c0, w0 = time.process_time(), time.perf_counter()
            codec.decode_chunks(blobs, calibrations=resolver)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        bits = sum(len(b) for b in blobs) * 8 / (2 * keys.size)
        rows.append({"variant": variant, "cpu_s": round(min(cpu), 4),
                     "wall_s": round(min(wall), 4), "bits": round(bits, 4)})
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| variant | bits | decode CPU s | x plain | wall s | x plain |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['bits']} | {r['cpu_s']} | {r['cpu_s'] / base['cpu_s']:.2f} |"
              f" {r['wall_s']} | {r['wall_s'] / base['wall_s']:.2f} |")


if __name__ == "__main__":
    main()
