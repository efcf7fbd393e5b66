"""`python -m codec.bench [--json]`: encode/decode speed and size of every level on real KV.

The KV is the default model's (SmolLM2-135M, 30 layers x 192 channels) over 4,096 tokens, as
recorded by `python -m benchmarks.record_kv` into benchmarks/data/kv4096.npz. Without that file
the repository's test fixture (a few layers, a few hundred tokens of the same model) is tiled
up to that shape; run from an installed wheel, which has neither, it codes synthetic KV of that
shape (Gaussian, with per-channel offsets and scales like real keys: speeds are indicative,
sizes are not). The output says which. Documents are encoded in 256-token chunks and decoded
chunk by chunk; MB/s are of fp16 KV (2 bytes per element), medians of several runs after a
warm-up. Two decode figures: into fresh arrays (`decode_MBps`), and as the engine restores a
document (`decode_engine_MBps`): with out= into one reused buffer laid out like llama.cpp's
state, keys token-major and values channel-major (V as llama.cpp keeps it without flash
attention: the slower layout; the app's default, flash attention, keeps V token-major).
Next to them, in the same runs, a plain numpy copy of the same number of bytes (`memcpy_MBps`,
into a destination as large as the KV, so never in cache) with one thread and with as many
threads as numba's decoder uses, and a decode with numba held to one thread: `decode_vs_memcpy`
(both cores) and `decode_1thread_vs_memcpy` (one) are the ratios the decoder is judged by;
`decode_1thread_vs_memcpy_cpu` is the one-thread ratio in process CPU seconds, which other
work on the machine changes least.
`--cold` measures instead what a fresh process (every `kvdesk ask`) pays for tables: each
level's first decode of one 256-token chunk against the same decode again.
`cpu_s` is the process CPU time of a median run: on a shared machine wall time far above
cpu_s / threads means the cores were busy with other work. Run as the
app runs: `codec` sets OMP_WAIT_POLICY=PASSIVE before numba loads, and the output names the
threading layer and thread count. A benchmark, not a test: it must never assert speed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba  # after the package: codec/backend.py sets OMP_WAIT_POLICY first
import numpy as np

from . import Calibration, decode, encode_chunks, levels, peek
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
    if path is None and not FIXTURE.exists():
        return (*synthetic_kv(), f"synthetic KV {SHAPE} (no recorded KV or test fixture here: "
                                 "speeds are indicative, bits per element are not real KV's)")
    with np.load(FIXTURE) as z:
        k, v = z["keys"], z["values"]
    reps = (-(-SHAPE[0] // k.shape[0]), -(-SHAPE[1] // k.shape[1]), 1)
    tile = [np.ascontiguousarray(np.tile(a, reps)[:, :SHAPE[1]][:SHAPE[0]]) for a in (k, v)]
    return tile[0], tile[1], (f"fixture {FIXTURE.name} {k.shape} tiled to {SHAPE} "
                              f"(run benchmarks/record_kv.py for a real 4,096-token KV)")


def synthetic_kv(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stand-in KV of SHAPE: keys with per-channel offsets and scales, values
    plain Gaussian."""
    rng = np.random.default_rng(seed)
    n_layer, _, n_ch = SHAPE
    offset = rng.standard_normal((n_layer, 1, n_ch)) * 2
    scale = np.exp(rng.standard_normal((n_layer, 1, n_ch)) * 0.5)
    keys = (rng.standard_normal(SHAPE, np.float32) * scale + offset).astype(np.float16)
    values = (rng.standard_normal(SHAPE, np.float32) * 0.5).astype(np.float16)
    return keys, values


def measure(keys: np.ndarray, values: np.ndarray, level: str, runs: int,
            calibration: Calibration | None = None) -> dict:
    mb = (keys.nbytes + values.nbytes) / 1e6
    resolver = {calibration.id: calibration} if calibration else None
    n_layer, n_tok, n_ch = keys.shape
    doc_k = np.empty_like(keys)
    doc_v = np.empty((n_layer, n_ch, n_tok), values.dtype).transpose(0, 2, 1)

    def decode_fresh(blobs: list[bytes]) -> None:
        for b in blobs:
            decode(b, calibrations=resolver)

    def decode_engine(blobs: list[bytes]) -> None:
        at = 0
        for b in blobs:
            n = peek(b).n_tokens
            decode(b, out=(doc_k[:, at:at + n], doc_v[:, at:at + n]), calibrations=resolver)
            at += n

    def decode_1thread(blobs: list[bytes]) -> None:
        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            decode_fresh(blobs)
        finally:
            numba.set_num_threads(threads)

    def encode(_) -> list[bytes]:
        return encode_chunks(keys, values, level, calibration=calibration)

    blobs = encode(None)  # warm-up: JIT caches, codebooks, buffers
    decode_fresh(blobs)
    decode_engine(blobs)
    copy = Memcpy(keys.nbytes + values.nbytes)
    steps = {"encode": encode, "decode": decode_fresh, "decode_engine": decode_engine,
             "decode_1thread": decode_1thread, "memcpy": copy.all_threads,
             "memcpy_1thread": copy.one_thread}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for _ in range(runs):
        for name, step in steps.items():
            cpu, wall = time.process_time(), time.perf_counter()
            out = step(blobs)
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
            blobs = out if name == "encode" else blobs
    size = sum(len(b) for b in blobs)
    result = {"bits_per_element": round(size * 8 / (keys.size + values.size), 4), "bytes": size}
    for name, rows in times.items():
        wall = sorted(w for w, _ in rows)
        result[f"{name}_MBps"] = round(mb / float(np.median(wall)), 1)
        # The best run shows what the kernels can do when the shared machine is quiet.
        result[f"{name}_MBps_best"] = round(mb / wall[0], 1)
        result[f"{name}_cpu_s"] = round(float(np.median([c for _, c in rows])), 3)
    for name, base in (("decode", "memcpy"), ("decode_1thread", "memcpy_1thread")):
        result[f"{name}_vs_memcpy"] = round(result[f"{name}_MBps"] / result[f"{base}_MBps"], 4)
    # on a busy machine wall time is the other work's; one thread's CPU seconds are ours
    cpu = {name: float(np.median([c for _, c in rows])) for name, rows in times.items()}
    result["decode_1thread_vs_memcpy_cpu"] = round(
        cpu["memcpy_1thread"] / max(cpu["decode_1thread"], 1e-9), 4)
    return result


class Memcpy:
    """A numpy copy of `nbytes` (the decoder's output) from one buffer into another, each as
    large as the output, so the destination is never in cache; with every numba thread the
    copy is cut in that many slices, copied at once (numpy lets the GIL go while it copies)."""

    def __init__(self, nbytes: int) -> None:
        self.src = np.ones(nbytes // 2, np.uint16)
        self.dst = np.zeros_like(self.src)  # faulted in now, not in the timed copies
        self.threads = numba.get_num_threads()

    def one_thread(self, _) -> None:
        np.copyto(self.dst, self.src)

    def all_threads(self, _) -> None:
        cuts = np.linspace(0, self.src.size, self.threads + 1).astype(np.int64)
        spans = [slice(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(lambda s: np.copyto(self.dst[s], self.src[s]), spans))


_COLD = """
import json, sys, time
import numpy as np
import codec
blobs = dict(np.load(sys.argv[1]))
# numba's compiled kernels load from its cache on first use: not the tables' cost
tiny = np.ones((1, 2, 8), np.float16)
kind = {"scale": "token", "bins": [5], "layer_edges": []}
codec.decode(codec.encode(tiny, tiny, {**codec.levels()["compact"].get_config(), "name": "warm",
                                       "keys": kind, "values": kind}))
out = {}
for name, blob in blobs.items():
    t0 = time.perf_counter(); codec.decode(blob.tobytes()); t1 = time.perf_counter()
    codec.decode(blob.tobytes()); t2 = time.perf_counter()
    out[name] = {"first_ms": round((t1 - t0) * 1e3, 1), "again_ms": round((t2 - t1) * 1e3, 1)}
print(json.dumps(out))
"""


def cold_start(keys: np.ndarray, values: np.ndarray, names: list[str]) -> dict:
    """In a fresh process: the first decode of one 256-token chunk per level, against the
    same decode again (the difference is what its tables cost a new `kvdesk ask`)."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "blobs.npz"
        np.savez(path, **{n: np.frombuffer(encode_chunks(keys[:, :256], values[:, :256], n)[0],
                                           np.uint8) for n in names})
        run = subprocess.run([sys.executable, "-c", _COLD, str(path)], capture_output=True,
                             text=True, check=True, cwd=ROOT)
    return json.loads(run.stdout)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m codec.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--kv", type=Path, help="an .npz with keys and values [L, T, C] float16")
    ap.add_argument("--levels", default=",".join(levels()), help="comma-separated level names")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--calibration", type=Path,
                    help="a model calibration (.kvcl) for this KV: its levels among --levels are "
                         "measured too, as NAME@calibrated, in the same run")
    ap.add_argument("--cold", action="store_true",
                    help="only the cold start: each level's first decode in a fresh process")
    args = ap.parse_args(argv)
    keys, values, source = load_kv(args.kv)
    if args.cold:
        print(json.dumps({"cold_start": cold_start(keys, values, args.levels.split(",")),
                          "kv": {"shape": list(keys.shape), "source": source},
                          "loadavg_1min": round(os.getloadavg()[0], 2)}))
        return
    load_before = os.getloadavg()[0]
    cal = Calibration.from_bytes(args.calibration.read_bytes()) if args.calibration else None
    names = args.levels.split(",")
    measured = {name: measure(keys, values, name, args.runs) for name in names}
    for name in [n for n in cal.level_names if n in names] if cal else ():
        measured[f"{name}@calibrated"] = measure(keys, values, name, args.runs, cal)
    result = {"levels": measured,
              "kv": {"shape": list(keys.shape), "source": source},
              "backend": active().name, "runs": args.runs,
              "threading": {"layer": numba.threading_layer(), "threads": numba.get_num_threads(),
                            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")},
              # other work on the machine shows here, and in MB/s far below the kernels'
              "loadavg_1min": {"before": round(load_before, 2),
                               "after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}}
    if args.json:
        print(json.dumps(result))
        return
    load = result["loadavg_1min"]
    th = result["threading"]
    print(f"KV {keys.shape} from {source}; backend {result['backend']} ({th['layer']}, "
          f"{th['threads']} threads, OMP_WAIT_POLICY={th['OMP_WAIT_POLICY']}); median of "
          f"{args.runs}; load average {load['before']} -> {load['after']} on {load['cpus']} CPUs")
    print(f"{'level':<20} {'encode MB/s':>12} {'decode MB/s':>12} {'engine MB/s':>12} "
          f"{'bits/elem':>10} {'vs memcpy':>10} {'1 thread':>9}   (best run: encode, decode, "
          "engine)")
    for name, r in result["levels"].items():
        print(f"{name:<20} {r['encode_MBps']:>12} {r['decode_MBps']:>12} "
              f"{r['decode_engine_MBps']:>12} {r['bits_per_element']:>10} "
              f"{r['decode_vs_memcpy']:>10} {r['decode_1thread_vs_memcpy']:>9}   "
              f"({r['encode_MBps_best']}, {r['decode_MBps_best']}, "
              f"{r['decode_engine_MBps_best']})")
        print(f"{'':<20} memcpy {r['memcpy_MBps']} MB/s ({th['threads']} threads), "
              f"{r['memcpy_1thread_MBps']} MB/s (1); decode {r['decode_1thread_MBps']} MB/s "
              f"(1 thread); 1-thread ratio in CPU seconds {r['decode_1thread_vs_memcpy_cpu']}")


if __name__ == "__main__":
    main()
