"""The restore's kernels compiled ahead of time, so that a fresh process decodes without numba.

A fresh process pays ~0.4 s for numba's JIT kernels before its first decode even when numba's
cache holds them: importing numba (0.2-0.25 s on the 2-core machines), readying its compiler's
registries and runtime on the first dispatch (0.1-0.15 s), loading each signature. numba's
`pycc` compiles the same Python functions (`py_func`) into an extension module instead; it
imports in under a millisecond and needs no numba. It has no parallel loops, so its kernels run
on one core (about half the JIT kernels' speed on two): the CPU backend runs them only until
the process has loaded the JIT ones (`backend.prefer_jit`), i.e. for a one-shot command and
for a window's first reopens while its warm-up still loads numba in the background.

Exported, with the argument types the decoder passes (`EXPORTS`): the rANS decoder (into fp16
bits and into float32 coefficients), the inverse transform and the channel-major copy: every
kernel a restore reaches. A compiled function has exactly one signature and pycc's wrapper
does not check an array's layout (a strided view passed as contiguous reads the wrong bytes),
so `kernel(name, args)` hands out a function only when every argument matches its signature
exactly, and None otherwise: the caller then runs the JIT kernel.

The module's name carries a hash of the kernels' sources, this file and Python's version, so a
stale one is never loaded; `build()` writes it beside this file (`make venv`:
`python -m codec.precompile aot`), for the architecture's baseline CPU (measured within 5 % of
this CPU's own target). KVDESK_CODEC_AOT=0 turns it off. It must never change what a blob
contains: its bytes are tested equal to the JIT kernels'.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent / "kernels"
PREFIX = "kvdesk_aot_"
ENV = "KVDESK_CODEC_AOT"

INT, BOOL = "int64", "bool"


def _array(dtype: str, ndim: int, layout: str = "C", readonly: bool = False) -> tuple:
    return (dtype, ndim, layout, readonly)


def _decode(dq: str) -> tuple:
    """rans.decode(words, counts, ent, fc, lut, dq, akey, bkey, out, t0, lanes, states)."""
    return (_array("uint16", 1, readonly=True), _array("uint32", 2, readonly=True),
            _array("int64", 2), _array("int64", 2), _array("uint8", 2), _array(dq, 4),
            _array("int64", 1), _array("int64", 1), _array(dq, 3, "A"), INT, INT, INT)


# kernel name -> (kernels module, function, return type, one argument tuple per export).
# An array argument is (dtype, ndim, layout, readonly); "A" accepts any strides.
EXPORTS = {
    "decode": ("rans", "decode", BOOL, (_decode("uint16"), _decode("float32"))),
    "untransform": ("tkernel", "_untransform", "none", (
        (_array("float32", 3), _array("uint16", 3, "A"), _array("float32", 4),
         *[_array("float32", 2)] * 4, INT, INT, BOOL, BOOL, BOOL, BOOL),)),
    "to_channel_major": ("rans", "to_channel_major", "none", (
        (_array("uint16", 3), _array("uint16", 3, "A"), INT),)),
}


def module_name() -> str:
    """The extension module's name for these kernel sources, this spec and this Python."""
    h = hashlib.sha256(sys.implementation.cache_tag.encode())
    # this file by name: in the bundle __file__ names the archived bytecode beside it
    for path in [HERE / "aot.py", *sorted(KERNELS.glob("*.py"))]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return PREFIX + h.hexdigest()[:16]


def _matches(arg, spec) -> bool:
    if spec == INT:
        return isinstance(arg, int | np.integer) and not isinstance(arg, bool | np.bool_)
    if spec == BOOL:
        return isinstance(arg, bool | np.bool_)
    dtype, ndim, layout, readonly = spec
    return (isinstance(arg, np.ndarray) and arg.dtype == dtype and arg.ndim == ndim
            and arg.flags.aligned and (layout == "A" or arg.flags.c_contiguous)
            and (readonly or arg.flags.writeable))


@functools.cache
def load(folder: Path = HERE):
    """The compiled module for these sources in `folder`, or None (not built, stale, off)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        name = module_name()
    except OSError:  # a kernel's source missing beside its bytecode: the JIT serves
        return None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder / f"{name}{suffix}"
        if path.is_file():
            try:
                spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            except (ImportError, OSError):
                return None  # unloadable here (another libc, a damaged file): the JIT serves
            return module
    return None


def kernel(name: str, args: tuple):
    """The compiled `name` whose signature these arguments match exactly, or None."""
    module = load()
    if module is None or name not in EXPORTS:
        return None
    for i, specs in enumerate(EXPORTS[name][3]):
        if len(args) == len(specs) and all(map(_matches, args, specs)):
            return getattr(module, f"{name}_{i}")
    return None


def _numba_type(spec):
    from numba import types

    if spec in (INT, BOOL):
        return types.int64 if spec == INT else types.boolean
    if spec == "none":
        return types.void
    dtype, ndim, layout, readonly = spec
    return types.Array(getattr(types, dtype), ndim, layout, readonly=readonly)


@contextlib.contextmanager
def _jit_cache_untouched():
    """pycc types an export's callees (`_decode_group`, ...) through their JIT dispatchers,
    which would save the signatures it needs to numba's cache: its index files would change
    after `precompile` stamped them, and every one-shot command would then warm the codec up
    (import numba beside its restore) until a window ran again. Those compiles stay in memory."""
    from numba.core.caching import NullCache
    from numba.core.dispatcher import Dispatcher

    saved: dict[int, tuple] = {}  # a kernel one module imports from another is seen twice
    try:
        for path in sorted(KERNELS.glob("*.py")):
            if path.stem == "__init__":
                continue
            module = importlib.import_module(f"codec.kernels.{path.stem}")
            for obj in vars(module).values():
                if isinstance(obj, Dispatcher) and id(obj) not in saved:
                    saved[id(obj)] = (obj, obj._cache)
                    obj._cache = NullCache()
        yield
    finally:
        for obj, cache in saved.values():
            obj._cache = cache


def build(folder: Path = HERE) -> Path:
    """Compile every export into `folder` (its older builds removed); returns the module's
    path. Needs numba and a C compiler (setuptools finds it)."""
    from numba.pycc import CC

    name = module_name()
    cc = CC(name)
    cc.target_cpu = ""  # the architecture's baseline: the module runs on any CPU of it
    cc.verbose = False
    for kname, (module, function, result, variants) in EXPORTS.items():
        py_func = getattr(importlib.import_module(f"codec.kernels.{module}"), function).py_func
        for i, specs in enumerate(variants):
            sig = _numba_type(result)(*map(_numba_type, specs))
            cc.export(f"{kname}_{i}", sig)(py_func)
    with tempfile.TemporaryDirectory(dir=folder) as tmp, _jit_cache_untouched():
        cc.output_dir = tmp
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pycc's pending-deprecation notice
            cc.compile()
        (built,) = Path(tmp).glob(f"{name}.*")
        for old in folder.glob(f"{PREFIX}*"):
            old.unlink()
        target = folder / built.name
        os.replace(built, target)
    load.cache_clear()
    return target
