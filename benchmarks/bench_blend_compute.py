"""The compute step of a blend, two ways: a restore of the prefix before each run, or one restore
and every run computed in place (`desktop_app.model.inplace`, what kvdesk does).

    .venv/bin/python -m benchmarks.bench_blend_compute [--model PATH] [--tokens 2000]
                                                       [--parts 8] [--fraction 0.05] [--repeat 3]

A prefix of `--tokens` tokens of Python's reference manual (pydoc topics) stands for an
assembled blend of `--parts` equal parts (a long document's passages); the runs computed again
are each later part's first `--fraction` (`blending.leading`), as a cached long-document ask
computes them. Its KV is the prefix's own (which KV stands there changes nothing of the time).

    per run    the old way (kept here as the reference, and used by tests/test_inplace.py):
               for each run the assembled KV before it restored, the run prefilled, the whole
               state captured back; then the whole prefix restored
    in place   the whole prefix restored once, each run computed through a second sequence

Prints one JSON document: for each way the median wall and process CPU seconds over
`--repeat` tries (the two ways taking turns), and the restores, captures and bytes restored;
the largest difference between the two ways' KV after (0: bit-identical); the first in-place
call's seconds apart (it makes the context again with two sequences, once per runtime).

`move` times the step before: every later part's keys turned to its place (`rope.rerotate`,
one offset a part, as a cached ask moves each passage's), against the way it was written
before (angles per layer and per token, pairs gathered by index; kept here as the
reference), with whether the two give the same bits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import text_of
from desktop_app.kv.blending import _runs, leading
from desktop_app.model import inplace, rope
from desktop_app.model.kvstate import KVState, SeqState, in_position_order
from desktop_app.model.models import content_hash, resolve_model_path
from desktop_app.model.runtime import Runtime


def state(rt: Runtime, keys: np.ndarray, values: np.ndarray) -> SeqState:
    return SeqState([KVState(keys, values, np.arange(keys.shape[1], dtype=np.int32),
                             v_trans=rt.layout.v_trans)])


def restore_per_run(rt: Runtime, tokens: list[int], keys: np.ndarray, values: np.ndarray,
                    runs: list[tuple[int, int]]) -> int:
    """The old way: the assembled KV before each run restored, the run prefilled after it and
    captured back; then the whole prefix restored. Bytes restored."""
    keys, values = keys.copy(), values.copy()
    restored = 0
    for a, b in runs:
        rt.restore(state(rt, keys[:, :a], values[:, :a]), tokens[:a])
        restored += a
        rt.prefill(tokens[a:b])
        kv = in_position_order(rt.capture().sections[0])
        keys[:, a:b], values[:, a:b] = kv.keys[:, a:b], kv.values[:, a:b]
    if not runs or runs[-1][1] != len(tokens):
        rt.restore(state(rt, keys, values), tokens)
        restored += len(tokens)
    return restored * rt.layout.kv_bytes_per_token


def restore_in_place(rt: Runtime, tokens: list[int], keys: np.ndarray, values: np.ndarray,
                     runs: list[tuple[int, int]]) -> int:
    """What blending does now: the whole prefix restored once, the runs computed in place."""
    inplace.restore(rt, state(rt, keys, values), tokens, runs)
    return len(tokens) * rt.layout.kv_bytes_per_token


def rerotate_reference(keys: np.ndarray, delta: np.ndarray, ropes: list) -> np.ndarray:
    """`rope.rerotate` as it was first written: the reference `move` compares against."""
    out = keys.astype(np.float32)
    delta = np.asarray(delta, np.float64)
    for layer, r in enumerate(ropes):
        n = len(r.theta)
        a, b = (2 * np.arange(n), 2 * np.arange(n) + 1) if r.kind == "norm" else \
            (np.arange(n), np.arange(n) + n)
        angle = delta[:, None] * r.theta[None, :]
        cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        heads = out[layer].reshape(out.shape[1], -1, r.head_dim)
        x0, x1 = heads[:, :, a].copy(), heads[:, :, b].copy()
        heads[:, :, a] = x0 * cos[:, None, :] - x1 * sin[:, None, :]
        heads[:, :, b] = x0 * sin[:, None, :] + x1 * cos[:, None, :]
    return out.astype(keys.dtype)


def move(keys: np.ndarray, part: int, ropes: list, turn) -> list[np.ndarray]:
    """Each later part's keys turned by `turn` as if computed at position 0 (its offset)."""
    return [turn(keys[:, at:at + part], np.full(part, at), ropes)
            for at in range(part, keys.shape[1] - part + 1, part)]


def timed(ways: dict, repeat: int) -> dict:
    """Median wall and CPU seconds of each way, the ways taking turns (a load that drifts
    weighs on both alike)."""
    walls, cpus = {name: [] for name in ways}, {name: [] for name in ways}
    restored = {}
    for _ in range(repeat):
        for name, fn in ways.items():
            w0, c0 = time.perf_counter(), time.process_time()
            restored[name] = fn()
            walls[name].append(time.perf_counter() - w0)
            cpus[name].append(time.process_time() - c0)
    return {name: {"wall_s": round(statistics.median(walls[name]), 3),
                   "cpu_s": round(statistics.median(cpus[name]), 3),
                   "bytes_restored": restored[name]} for name in ways}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--parts", type=int, default=8)
    p.add_argument("--fraction", type=float, default=0.05)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    model = resolve_model_path(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        digest = content_hash(model, Path(tmp) / "hashes.json")
        rt = Runtime(model, model_hash=digest, n_ctx=args.tokens + 256)
    tokens = rt.tokenize(text_of("pydoc"), add_bos=rt.adds_bos)[: args.tokens]
    rt.prefill(tokens)
    kv = in_position_order(rt.capture().sections[0])
    keys, values = kv.keys.copy(), kv.values.copy()
    part = len(tokens) // args.parts
    recompute = np.zeros(len(tokens), bool)
    for start in range(part, part * args.parts, part):
        recompute[list(leading(args.fraction)(start, part))] = True
    runs = _runs(recompute)
    t0 = time.perf_counter()  # the first one also makes the context again, two sequences
    restore_in_place(rt, tokens, keys, values, runs)
    first_in_place = time.perf_counter() - t0
    got = timed({"per_run": lambda: restore_per_run(rt, tokens, keys, values, runs),
                 "in_place": lambda: restore_in_place(rt, tokens, keys, values, runs)},
                args.repeat)
    old, new = got["per_run"], got["in_place"]
    restore_per_run(rt, tokens, keys, values, runs)
    after_old = in_position_order(rt.capture().sections[0])
    restore_in_place(rt, tokens, keys, values, runs)
    after_new = in_position_order(rt.capture().sections[0])
    diff = max(float(np.abs(after_old.keys.astype(np.float32) - after_new.keys).max()),
               float(np.abs(after_old.values.astype(np.float32) - after_new.values).max()))
    ropes = rope.probe(rt)
    moves = timed({"reference": lambda: move(keys, part, ropes, rerotate_reference),
                   "rerotate": lambda: move(keys, part, ropes, rope.rerotate)}, args.repeat)
    same = all(np.array_equal(x, y) for x, y in zip(
        moves["reference"].pop("bytes_restored"), moves["rerotate"].pop("bytes_restored"),
        strict=True))
    print(json.dumps({
        "model": str(model), "tokens": len(tokens), "parts": args.parts,
        "runs": len(runs), "recomputed_tokens": int(recompute.sum()),
        "per_run": {**old, "restores": len(runs) + 1, "captures": len(runs)},
        "in_place": {**new, "restores": 1, "captures": 0,
                     "first_s": round(first_in_place, 3)},
        "wall_ratio": round(old["wall_s"] / max(new["wall_s"], 1e-9), 2),
        "cpu_ratio": round(old["cpu_s"] / max(new["cpu_s"], 1e-9), 2),
        "largest_kv_difference": diff,
        "move": {**moves, "same_bits": same,
                 "cpu_ratio": round(moves["reference"]["cpu_s"] / max(
                     moves["rerotate"]["cpu_s"], 1e-9), 2)}}, indent=2))
    rt.close()


if __name__ == "__main__":
    main()
