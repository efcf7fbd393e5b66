"""The restore's kernels compiled ahead of time (codec/backend/aot.py): the JIT kernels' bytes
in every layout the app decodes into, refused arguments that do not match their signature
exactly, a stale module never loaded, and a fresh process that decodes every level without
importing numba."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from codec_helpers import calibration_of, real_kv

import codec
from codec import backend
from codec.backend import aot

ROOT = Path(__file__).resolve().parent.parent
CALIBRATED = ("high", "balanced", "compact")


@pytest.fixture(scope="module")
def built():
    """The checkout's module (`make venv` builds it), built here where it is missing."""
    if aot.load() is None:
        aot.build()
    assert aot.load() is not None
    return aot.load()


@pytest.fixture
def ahead(monkeypatch, built):
    """The CPU backend as a fresh process has it: the compiled kernels serve until
    `prefer_jit()` (another test's precompile may have called it in this process)."""
    monkeypatch.setattr(backend, "_JIT_PREFERRED", threading.Event())
    served = []
    kernel = aot.kernel

    def counting(name, args):
        fn = kernel(name, args)
        served.append((name, fn is not None))
        return fn

    monkeypatch.setattr(aot, "kernel", counting)
    return served


@pytest.fixture(scope="module")
def blobs():
    keys, values = real_kv(80)
    cal = calibration_of(keys, values, level="balanced")
    exact = calibration_of(keys, values, level="compact", block=64)
    out = [(codec.encode(keys[:, 40:], values[:, 40:], level, first_token=40), None)
           for level in codec.levels()]
    for c in (cal, exact):
        for name in c.level_names:
            out.append((codec.encode(keys[:, 40:], values[:, 40:], name, first_token=40,
                                     calibration=c), c))
    return out


def _layouts(shape):
    n_layer, n_tok, n_ch = shape
    yield None
    yield tuple(np.empty((n_layer, n_ch, n_tok), np.float16).transpose(0, 2, 1) for _ in range(2))
    big = [np.empty((n_layer, n_tok + 7, n_ch), np.float16) for _ in range(2)]
    yield tuple(b[:, 3:3 + n_tok] for b in big)


def test_compiled_kernels_write_the_jit_bytes_in_every_layout(ahead, blobs):
    jit = backend.jit()
    for blob, cal in blobs:
        found = {cal.id: cal} if cal else None
        want = codec.decode(blob, calibrations=found, backend=jit)
        for out in _layouts(want[0].shape):
            got = codec.decode(blob, out=out, calibrations=found)
            for a, b in zip(got, want, strict=True):
                assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), codec.peek(blob)
    kinds = {name for name, hit in ahead if hit}
    assert kinds == {"decode", "untransform", "to_channel_major"}
    assert all(hit for _, hit in ahead)  # every call the decoder made was served ahead of time


def test_prefer_jit_hands_every_kernel_back_to_numba(ahead, blobs):
    blob, _ = blobs[1]
    backend.prefer_jit()
    want = codec.decode(blob, backend=backend.jit())
    got = codec.decode(blob)
    assert ahead == [] and np.array_equal(got[0].view(np.uint16), want[0].view(np.uint16))


def test_arguments_off_the_signature_are_left_to_the_jit(built):
    words, counts = np.zeros(8, np.uint16), np.zeros((2, 1), np.uint32)
    tab, lut, dq = np.zeros((2, 4), np.int64), np.zeros((2, 4), np.uint8), \
        np.zeros((2, 1, 1, 4), np.uint16)
    keys, out = np.zeros(3, np.int64), np.zeros((2, 3, 4), np.uint16)
    args = [words, counts, tab, tab, lut, dq, keys, keys, out, 0, 32, 4]
    assert aot.kernel("decode", tuple(args)) is built.decode_0
    for at, bad in [(0, np.zeros(16, np.uint16)[::2]),  # strided where contiguous is compiled
                    (5, dq.astype(np.float32)),  # another dtype than its out's
                    (8, out[None]),  # another number of dimensions
                    (9, 0.0), (11, True)]:  # a float or a bool for an integer
        assert aot.kernel("decode", tuple(args[:at] + [bad] + args[at + 1:])) is None, at
    readonly = out.copy()
    readonly.flags.writeable = False
    assert aot.kernel("decode", tuple(args[:8] + [readonly] + args[9:])) is None
    assert aot.kernel("decode", tuple(args[:-1])) is None
    assert aot.kernel("quantize", tuple(args)) is None  # encoding is the JIT's


def test_a_module_built_for_other_kernel_sources_is_never_loaded(built, tmp_path, monkeypatch):
    kernels = tmp_path / "kernels"
    shutil.copytree(aot.KERNELS, kernels, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(aot, "KERNELS", kernels)
    assert aot.module_name() == built.__name__
    shutil.copy(built.__file__, tmp_path)
    assert aot.load(tmp_path) is not None
    (kernels / "rans.py").write_text((kernels / "rans.py").read_text() + "\n# changed\n")
    assert aot.module_name() != built.__name__
    aot.load.cache_clear()
    assert aot.load(tmp_path) is None  # its name no longer matches: the JIT serves
    aot.load.cache_clear()


def test_a_damaged_module_is_not_loaded(tmp_path, monkeypatch, built):
    name = Path(built.__file__).name
    (tmp_path / name).write_bytes(b"\x7fELF not really")
    assert aot.load(tmp_path) is None
    monkeypatch.setenv(aot.ENV, "0")
    aot.load.cache_clear()
    assert aot.load() is None  # KVDESK_CODEC_AOT=0: off
    monkeypatch.delenv(aot.ENV)
    aot.load.cache_clear()


_FRESH = """
import json, sys
from pathlib import Path
import numpy as np
import codec
blobs = Path(sys.argv[1]).read_bytes()
cals = {}
for p in sys.argv[2:]:
    c = codec.Calibration.from_bytes(Path(p).read_bytes())
    cals[c.id] = c
at, digests = 0, []
while at < len(blobs):
    n = int.from_bytes(blobs[at:at + 8], "little")
    k, v = codec.decode(blobs[at + 8:at + 8 + n], calibrations=cals)
    digests.append([int(k.view(np.uint16).sum(dtype=np.int64)),
                    int(v.view(np.uint16).sum(dtype=np.int64))])
    at += 8 + n
print(json.dumps({"numba": "numba" in sys.modules, "digests": digests}))
"""


def test_a_fresh_process_decodes_every_level_without_numba(built, blobs, tmp_path):
    (tmp_path / "blobs.bin").write_bytes(b"".join(len(b).to_bytes(8, "little") + b
                                                  for b, _ in blobs))
    cal_paths = []
    for i, cal in enumerate({c.id: c for _, c in blobs if c}.values()):
        cal_paths.append(tmp_path / f"cal{i}.kvcl")
        cal_paths[-1].write_bytes(cal.to_bytes())
    run = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path / "blobs.bin"),
                          *map(str, cal_paths)], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    got = json.loads(run.stdout)
    want = []
    for blob, cal in blobs:
        k, v = codec.decode(blob, calibrations={cal.id: cal} if cal else None,
                            backend=backend.jit())
        want.append([int(k.view(np.uint16).sum(dtype=np.int64)),
                     int(v.view(np.uint16).sum(dtype=np.int64))])
    assert got == {"numba": False, "digests": want}


def test_building_leaves_numbas_cache_of_the_jit_kernels_as_it_was():
    """pycc compiles an export's callees through their JIT dispatchers: saved to numba's cache,
    they would change the files the kernels-cached stamp lists, and one-shot commands would
    warm the codec up again (`jitcache.kernels_cached`)."""
    from numba.core.dispatcher import Dispatcher

    from codec.kernels import quant, rans, tables, tkernel

    kernels = [k for m in (quant, rans, tables, tkernel) for k in vars(m).values()
               if isinstance(k, Dispatcher)]
    caches = [k._cache for k in kernels]
    index = Path(rans.group_offsets._cache._cache_file._index_path)
    before = index.stat().st_mtime_ns if index.exists() else None
    with aot._jit_cache_untouched():
        # a signature no step compiles: without the guard it would be saved to the index
        rans.group_offsets(np.ones((2, 3), np.int16))
    after = index.stat().st_mtime_ns if index.exists() else None
    assert after == before
    # every kernel's own cache put back, also one that two modules hold (tkernel's _f32)
    assert all(k._cache is c for k, c in zip(kernels, caches, strict=True))
    assert type(rans.group_offsets._cache).__name__ == "FunctionCache"
