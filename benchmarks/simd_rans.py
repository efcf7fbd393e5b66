"""A SIMD rANS decoder, tried against the shipped numba kernel (not part of the codec).

    .venv/bin/python -m benchmarks.simd_rans --kv kv4096.npz [--level balanced] [--pairs 1,2,4]
                                             [--hot]

Encodes the recorded KV in 256-token chunks, captures the arguments of every `rans.decode`
call that decoding them makes, compiles benchmarks/simd_rans.c (gcc -O3 -mavx2) once per
--pairs value, checks that it writes the numba kernel's bytes on every call, then times both
on one thread (process CPU seconds, best of 5, interleaved). --hot points every lane at the
same table row (timing only: the bytes are then wrong) to see what the lookups' cache misses
cost. x86-64 with AVX2 and a C compiler only. A benchmark: it never asserts speed.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

import codec
from codec import backend
from codec.bench import load_kv
from codec.kernels import rans

SOURCE = Path(__file__).with_name("simd_rans.c")


def captured_calls(keys, values, level: str) -> list[tuple]:
    be = backend.jit()
    calls, real = [], be.decode

    def grab(*args):
        calls.append(args)
        return real(*args)

    be.decode = grab
    for t in range(0, keys.shape[1], 256):
        codec.decode(codec.encode(keys[:, t:t + 256], values[:, t:t + 256], level, first_token=t),
                     backend=be)
    return calls


def c_arguments(args) -> dict:
    """The C kernel's per-group arrays for one `rans.decode` call's arguments."""
    words, counts, ent, fc, lut, dq, akey, bkey, out, t0, lanes, states = args
    n_layer, n_grp = counts.shape
    n_a, n_b, width = dq.shape[1:]
    off = np.zeros(n_layer * n_grp + 1, np.int64)
    np.cumsum(counts.ravel(), out=off[1:])
    s0, s1, s2 = (s // out.itemsize for s in out.strides)
    if states != 4 or lanes % 4 or s2 != 1:
        raise SystemExit("the experiment decodes 4 states, lanes % 4 == 0, token-major only")
    layer = np.repeat(np.arange(n_layer), n_grp)
    return {"n": n_layer * n_grp, "nl": lanes, "T": len(akey), "words": words, "off": off,
            "lut_at": (ent * lut.shape[1]).astype(np.int32),
            "fc_at": (ent * fc.shape[1]).astype(np.int32),
            "dq_at": ((np.arange(n_layer)[:, None] * n_a * n_b + bkey[None, :]) * width
                      ).astype(np.int32),
            "lut": lut, "fc": fc, "dq": np.ascontiguousarray(dq),
            "tok_dq": (akey * (n_b * width)).astype(np.int64),
            "out_at": (layer * s0 + t0 * s1 + np.tile(np.arange(n_grp) * lanes, n_layer)
                       ).astype(np.int64), "row": s1, "ok": np.zeros(n_layer * n_grp, np.uint8)}


def compiled(pairs: int, folder: Path):
    lib = folder / f"simd_rans_{pairs}.so"
    subprocess.run(["gcc", "-O3", "-mavx2", "-mfma", "-mbmi2", "-mpopcnt", "-shared", "-fPIC",
                    f"-DPAIRS={pairs}", "-o", str(lib), str(SOURCE)], check=True)
    fn = ctypes.CDLL(str(lib)).kvdesk_rans_decode16
    fn.restype = None
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731

    def run(c: dict, out: np.ndarray) -> bool:
        i64 = ctypes.c_int64
        fn(i64(c["n"]), i64(c["nl"]), i64(c["T"]), ptr(c["words"]), ptr(c["off"]),
           ptr(c["lut_at"]), ptr(c["fc_at"]), ptr(c["dq_at"]), ptr(c["lut"]), ptr(c["fc"]),
           ptr(c["dq"]), ptr(c["tok_dq"]), ptr(out), ptr(c["out_at"]), i64(c["row"]),
           ptr(c["ok"]))
        return bool(c["ok"].all())
    return run


def best_cpu(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", type=Path, required=True, help="recorded KV (benchmarks.record_kv)")
    ap.add_argument("--level", default="balanced")
    ap.add_argument("--pairs", default="1,2,4", help="pairs of groups decoded in lockstep")
    ap.add_argument("--hot", action="store_true", help="every lane on one table row (timing)")
    args = ap.parse_args(argv)
    keys, values, _ = load_kv(args.kv)
    calls = captured_calls(keys, values, args.level)
    cargs = [c_arguments(a) for a in calls]
    if args.hot:
        for c in cargs:
            c["lut_at"][:], c["fc_at"][:] = c["lut_at"][0, 0], c["fc_at"][0, 0]
    outs = [np.zeros_like(a[8]) for a in calls]
    n_sym = sum(o.size for o in outs)
    numba.set_num_threads(1)

    def shipped():
        for a, o in zip(calls, outs, strict=True):
            rans.decode(*a[:8], o, *a[9:])

    with tempfile.TemporaryDirectory() as tmp:
        for pairs in map(int, args.pairs.split(",")):
            run = compiled(pairs, Path(tmp))
            if not args.hot:
                for a, c in zip(calls, cargs, strict=True):
                    want, got = np.zeros_like(a[8]), np.zeros_like(a[8])
                    assert rans.decode(*a[:8], want, *a[9:]) and run(c, got)
                    assert np.array_equal(got, want), "the C kernel wrote other bytes"

            def simd(run=run):
                for c, o in zip(cargs, outs, strict=True):
                    run(c, o)
            for name, fn in (("numba", shipped), (f"simd {pairs} pairs", simd)) * 2:
                s = best_cpu(fn)
                print(f"{name}: {s * 1000:.1f} ms CPU, {s / n_sym * 1e9:.2f} ns a symbol")


if __name__ == "__main__":
    main()
