"""Running every kernel the app can reach, so that numba compiles (or loads) them ahead of use.

Which kernels exist is written nowhere here: `steps()` calls the public API — every level,
with the array kinds the app passes (whole chunks and strided views of a document's buffer,
into fresh arrays and into views token-major and channel-major, blobs as the store's bytes)
— so a kernel
or a level added to the codec is compiled as soon as the API uses it. numba compiles one
machine-code version per argument *type* (dtype, dimensions, layout, writability), never per
shape, so a small chunk compiles everything a large one needs.

The steps run numba's JIT kernels (`backend.jit()`), and once all have run the CPU backend
prefers them to those compiled ahead of time. Used by the bundle build (into the shipped
cache, see `jitcache`), `make venv` (the checkout's cache; then `aot`, the restore's kernels
compiled ahead of time: `backend/aot.py`) and the app's background preparation
(`desktop_app.calibration.codec_prep`). It must never change what a blob contains and never
touch anything outside the codec.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import decode, encode, levels
from .backend import aot, jit, prefer_jit
from .calibrated.calibration import fitted
from .jit import jitcache

# Small, but with the app's structure: more than one 32-lane group, a sink token, views.
SMALL_SHAPE = (2, 48, 64)


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[], None]


def _document(n_layer: int, n_tok: int, n_ch: int, *, channel_major: bool) -> np.ndarray:
    """A writable float16 [n_layer, n_tok, n_ch] view laid out like a llama.cpp state buffer:
    each layer behind a small header (so no layout is contiguous), V optionally channel-major."""
    head, layer = 12, n_tok * n_ch * 2
    buf = bytearray(n_layer * (head + layer))
    inner = (2, 2 * n_tok) if channel_major else (2 * n_ch, 2)
    return np.ndarray((n_layer, n_tok, n_ch), np.float16, buf, offset=head,
                      strides=(head + layer, *inner))


def steps(shape: tuple[int, int, int] = SMALL_SHAPE,
          level_names: Sequence[str] | None = None) -> list[Step]:
    """The calls that reach every kernel, one encode and one decode step per level (default:
    every level), for chunks of `shape` ([n_layer, chunk tokens, channels]). The first steps
    compile the most; with the app's shape they also ready its per-shape plans and tables."""
    n_layer, n_tok, n_ch = shape
    rng = np.random.default_rng(0)
    keys, values = (rng.standard_normal((n_layer, 2 * n_tok, n_ch)).astype(np.float16)
                    for _ in range(2))
    doc_k = _document(n_layer, 2 * n_tok, n_ch, channel_major=False)
    doc_v = _document(n_layer, 2 * n_tok, n_ch, channel_major=True)
    doc_k[...], doc_v[...] = keys, values
    blobs: dict[str, list] = {}
    be = jit()  # numba's kernels, not those compiled ahead of time: these steps load them

    def encode_level(level: str) -> None:
        first = encode(np.ascontiguousarray(keys[:, :n_tok]),
                       np.ascontiguousarray(values[:, :n_tok]), level, backend=be)
        later = encode(doc_k[:, n_tok:], doc_v[:, n_tok:], level, first_token=n_tok, backend=be)
        blobs[level] = [first, later]

    def decode_level(level: str) -> None:
        first, later = blobs.pop(level)
        decode(first, backend=be)
        decode(later, out=(doc_k[:, n_tok:], doc_v[:, n_tok:]), backend=be)

    def calibrated() -> None:
        # A model's calibrated levels code through transforms: their kernels too.
        head_dim = 64 if n_ch % 64 == 0 else n_ch
        cal = fitted(keys, values, levels()["balanced"], "calibrated", head_dim)
        first = encode(np.ascontiguousarray(keys[:, :n_tok]),
                       np.ascontiguousarray(values[:, :n_tok]), "calibrated", calibration=cal,
                       backend=be)
        later = encode(doc_k[:, n_tok:], doc_v[:, n_tok:], "calibrated", first_token=n_tok,
                       calibration=cal, backend=be)
        decode(first, calibrations={cal.id: cal}, backend=be)
        decode(later, out=(doc_k[:, n_tok:], doc_v[:, n_tok:]), calibrations={cal.id: cal},
               backend=be)

    out = []
    for level in levels() if level_names is None else level_names:
        out.append(Step(f"encode {level}", lambda level=level: encode_level(level)))
        out.append(Step(f"decode {level}", lambda level=level: decode_level(level)))
    out.append(Step("calibrated levels", calibrated))
    # Every kernel these steps reach is now in numba's cache (a one-shot command may skip
    # its warm-up while that holds: `jitcache.kernels_cached`) and loaded in this process:
    # from here the CPU backend runs them, on every core.
    covered = list(levels() if level_names is None else level_names)

    def stamp() -> None:
        jitcache.mark_cached(covered)
        prefer_jit()

    out.append(Step("stamp", stamp))
    return out


def run(shape: tuple[int, int, int] = SMALL_SHAPE, level_names: Sequence[str] | None = None,
        progress: Callable[[int, int, str], None] | None = None) -> dict[str, float]:
    """Run every step; `progress(done, total, next step)` before each and at the end.
    Returns the seconds each step took."""
    return run_steps(steps(shape, level_names), progress)


def run_steps(todo: list[Step],
              progress: Callable[[int, int, str], None] | None = None,
              cancel: threading.Event | None = None,
              pause: Callable[[], None] | None = None) -> dict[str, float]:
    """`run`, on steps made by `steps()`; when `cancel` is set, stop before the next step (the
    seconds of those done are returned: each compiled kernel is cached as it is done).
    `pause()` is called before each step: it returns when the step may run (its wait is not
    counted in the step's seconds)."""
    took: dict[str, float] = {}
    for i, step in enumerate(todo):
        if pause is not None:
            pause()
        if cancel is not None and cancel.is_set():
            return took
        if progress:
            progress(i, len(todo), step.name)
        t0 = time.perf_counter()
        step.run()
        took[step.name] = round(time.perf_counter() - t0, 4)
    if progress:
        progress(len(todo), len(todo), "")
    return took


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m codec.precompile",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the seconds of each step")
    sub = ap.add_subparsers(dest="command")
    b = sub.add_parser("build", help="compile every kernel into a shipped cache in DIR "
                                     "(replaced), for a portable CPU target")
    b.add_argument("dir", type=Path)
    b.add_argument("--target", default=jitcache.portable_targets()[0],
                   choices=list(jitcache.TARGET_FEATURES),
                   help=f"default here: {jitcache.portable_targets()[0]}")
    c = sub.add_parser("check", help="say whether the shipped cache in DIR fits this machine")
    c.add_argument("dir", type=Path)
    sub.add_parser("aot", help="compile the restore's kernels ahead of time into the checkout "
                               "(codec/backend/aot.py: a fresh process decodes without numba)")
    args = ap.parse_args(argv)
    if args.command == "build":
        m = jitcache.build(args.dir, args.target)
        print(f"{len(m['files'])} cache files for {args.target} in {args.dir} "
              f"(compiled in {m['precompile']['seconds']} s)")
    elif args.command == "aot":
        t0 = time.perf_counter()
        path = aot.build()
        print(f"{path.name}: the restore's kernels, compiled ahead of time in "
              f"{time.perf_counter() - t0:.1f} s")
    elif args.command == "check":
        found = jitcache.verify(args.dir)
        print(f"usable, built for {found['target']}" if isinstance(found, dict) else found)
        sys.exit(not isinstance(found, dict))
    else:
        t0 = time.perf_counter()
        took = run()
        total = round(time.perf_counter() - t0, 2)
        print(json.dumps({"seconds": total, "steps": took, "levels": sorted(levels()),
                          **jitcache.status()}) if args.json
              else f"codec kernels ready in {total} s ({jitcache.status()['reason']})")


if __name__ == "__main__":
    main()
