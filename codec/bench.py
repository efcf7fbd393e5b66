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
`--cold` measures instead what the codec adds to a fresh process (every `kvdesk ask`):
`import codec` and one decode of a 256-token chunk at each level (with --calibration, each
calibrated level too), against `import numba` alone, in fresh processes (wall time, median of
--runs interleaved pairs).
`cpu_s` is the process CPU time of a median run: on a shared machine wall time far above
cpu_s / threads means the cores were busy with other work. Run as the
app runs: `codec` sets OpenMP's short spin (GOMP_SPINCOUNT) before numba loads, and the output
names the threading layer, thread count and wait settings. A benchmark, not a test: it must
never assert speed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba  # after the package: codec/backend/ sets GOMP_SPINCOUNT first
import numpy as np

from . import Calibration, decode, encode_chunks, levels, peek
from .backend import active, prefer_jit

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


# Fresh processes, as a new `kvdesk` command starts: numba alone, against the codec imported
# and each blob decoded once (the same numba import included, so the difference is the codec's).
_NUMBA_ONLY = "import numba"
_COLD = """
import sys
import codec
blobs = open(sys.argv[1], "rb").read()
cal = codec.Calibration.from_bytes(open(sys.argv[2], "rb").read()) if len(sys.argv) > 2 else None
found = {cal.id: cal} if cal else None
at = 0
while at < len(blobs):
    n = int.from_bytes(blobs[at:at + 8], "little")
    codec.decode(blobs[at + 8:at + 8 + n], calibrations=found)
    at += 8 + n
"""


def cold_blobs(keys: np.ndarray, values: np.ndarray, names: list[str],
               calibration: Calibration | None = None) -> bytes:
    """One 256-token chunk (tokens 256-512, no sink) per level, then per calibrated level,
    each behind its length: what `_COLD` decodes."""
    k, v = (np.ascontiguousarray(a[:, 256:512]) for a in (keys, values))
    blobs = [encode_chunks(k, v, n, first_token=256)[0] for n in names]
    blobs += [encode_chunks(k, v, n, first_token=256, calibration=calibration)[0]
              for n in (calibration.level_names if calibration else ())]
    return b"".join(len(b).to_bytes(8, "little") + b for b in blobs)


def _wall(args: list[str], cwd: Path) -> float:
    import subprocess
    import sys

    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, cwd=cwd, capture_output=True)
    return time.perf_counter() - t0


def cold_start(keys: np.ndarray, values: np.ndarray, names: list[str],
               calibration: Calibration | None = None, rounds: int = 5,
               cwd: Path = ROOT) -> dict:
    """Wall seconds of fresh processes, medians of `rounds` interleaved pairs: `import numba`
    alone, and `import codec` + the first decode of one 256-token chunk at each level (and
    each calibrated level). Their difference is what the codec adds to a new process's
    first restore before its kernels run warm: loading them from numba's cache, numba's own
    set-up on the first kernel, the codec's tables. The processes import the codec of the
    checkout `cwd` (another one's, for a before/after)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "blobs.bin"
        path.write_bytes(cold_blobs(keys, values, names, calibration))
        args = ["-c", _COLD, str(path)]
        if calibration is not None:
            (cal_path := Path(tmp) / "cal.kvcl").write_bytes(calibration.to_bytes())
            args.append(str(cal_path))
        _wall(args, cwd)  # a first run fills the OS's file cache (and numba's, were it missing)
        pairs = [(_wall(["-c", _NUMBA_ONLY], cwd), _wall(args, cwd)) for _ in range(rounds)]
    numba_s = float(np.median([a for a, _ in pairs]))
    codec_s = float(np.median([b for _, b in pairs]))
    return {"levels": names + [f"{n}@calibrated" for n in
                               (calibration.level_names if calibration else ())],
            "import_numba_s": round(numba_s, 3), "codec_first_decodes_s": round(codec_s, 3),
            "beyond_numba_s": round(float(np.median([b - a for a, b in pairs])), 3),
            "rounds": rounds}


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
                    help="only the cold start: fresh processes, import codec and decode each "
                         "level once, against import numba alone (--runs rounds)")
    args = ap.parse_args(argv)
    keys, values, source = load_kv(args.kv)
    cal = Calibration.from_bytes(args.calibration.read_bytes()) if args.calibration else None
    if args.cold:
        load_before = os.getloadavg()[0]
        print(json.dumps({"cold_start": cold_start(keys, values, args.levels.split(","), cal,
                                                   args.runs),
                          "kv": {"shape": list(keys.shape), "source": source},
                          "loadavg_1min": {"before": round(load_before, 2),
                                           "after": round(os.getloadavg()[0], 2)}}))
        return
    load_before = os.getloadavg()[0]
    # The steady state a running app reaches once its warm-up has loaded numba's kernels; a
    # fresh process's first restores (backend/aot.py) are what --cold measures.
    prefer_jit()
    names = args.levels.split(",")
    measured = {name: measure(keys, values, name, args.runs) for name in names}
    for name in [n for n in cal.level_names if n in names] if cal else ():
        measured[f"{name}@calibrated"] = measure(keys, values, name, args.runs, cal)
    result = {"levels": measured,
              "kv": {"shape": list(keys.shape), "source": source},
              "backend": active().name, "runs": args.runs,
              "threading": {"layer": numba.threading_layer(), "threads": numba.get_num_threads(),
                            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
                            "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT")},
              # other work on the machine shows here, and in MB/s far below the kernels'
              "loadavg_1min": {"before": round(load_before, 2),
                               "after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}}
    if args.json:
        print(json.dumps(result))
        return
    load = result["loadavg_1min"]
    th = result["threading"]
    print(f"KV {keys.shape} from {source}; backend {result['backend']} ({th['layer']}, "
          f"{th['threads']} threads, OMP_WAIT_POLICY={th['OMP_WAIT_POLICY']}, "
          f"GOMP_SPINCOUNT={th['GOMP_SPINCOUNT']}); median of "
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
