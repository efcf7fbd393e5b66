"""The backend room: the kernels that run the format, numba CPU, numba CUDA or the pure
reference, and the choice between them (here: `get(name)`, `active()`).

    aot         the restore's CPU kernels compiled ahead of time: a fresh process decodes
                without importing numba (until `prefer_jit()`; `jit()` never uses them)
    cuda        numba.cuda rANS encode and decode, bit-identical to the CPU kernels
    reference   the pure-NumPy reference of the quantization and rANS kernels: the bytes'
                definition the others are tested against

A backend is a plain namespace of the functions of `kernels/quant.py` and `kernels/rans.py`
(on the CPU each imported, with numba, on its first call) and an
`untransform(coef, out, KindTransform, cos, sin, gain)` (the inverse transform: on CPU and
GPU the same numba CPU kernel, whose float bytes are pinned to the reference's there; an
exact transform's integer sums by BLAS there, by int64 einsum in the reference). All
backends produce identical bytes, so the choice is only about speed: CUDA when a GPU is
present (rANS on the device, quantization on the CPU kernels), else the CPU kernels.
KVDESK_CODEC_BACKEND=cpu|cuda|reference forces one. A backend must never change what a
blob contains. The room stands on the kernels, the calibrated transforms (their inverse) and
`format`'s lane limit; it never imports the container, the pipeline or the chunk helpers: it
runs kernels, it never decides what a blob holds.

It also asks OpenMP for a short spin (unless the user chose a wait policy or a spin count):
numba's default OpenMP layer otherwise leaves its worker spinning ~300,000 times after every
kernel, and on a 2-core machine that spinning starves the main thread (the codec measured
3-4x slower end to end); no spin at all makes every wait a sleep and a wake. This only takes
effect if nothing in the process has started OpenMP yet (llama.cpp also uses it), so an
application should import the codec early or set GOMP_SPINCOUNT itself.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
import sys
import threading
from types import SimpleNamespace

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")

import numpy as np

from ..calibrated import intinverse, transform
from ..errors import CodecError
from ..kernels.workspace import scratch
from . import aot, reference

NAMES = ("cpu", "cuda", "reference")


# One parallel kernel at a time: each already uses every core, and numba's fallback threading
# layer (workqueue, where OpenMP and TBB are missing) aborts the process on concurrent use.
_KERNEL_LOCK = threading.Lock()
# Set once the process has loaded numba's kernels: until then the kernels `aot` compiled
# ahead of time serve the restore (one core, but no numba to import and ready first).
_JIT_PREFERRED = threading.Event()

# kernel name -> (module of kernels/, its numba function)
_JIT = {"any_nonfinite": ("quant", "any_nonfinite"), "quantize": ("quant", "quantize"),
        "choose_entries": ("quant", "choose_entries"), "encode": ("rans", "encode"),
        "decode": ("rans", "decode"), "to_channel_major": ("rans", "to_channel_major"),
        "untransform": ("tkernel", "_untransform")}


def prefer_jit() -> None:
    """From now on the CPU backend runs numba's JIT kernels (parallel), loading or compiling
    each on first use: `precompile` calls it once its steps have loaded them all, a benchmark
    of steady-state speed at its start."""
    _JIT_PREFERRED.set()


def _kernel(name: str, ahead: bool):
    """The CPU kernel `name`, serialized; its module (and numba) imported on first use. With
    `ahead`, the ahead-of-time compiled one where it exists and the arguments match it, until
    `prefer_jit()`."""
    module, attr = _JIT[name]

    def run(*args):
        fn = aot.kernel(name, args) if ahead and not _JIT_PREFERRED.is_set() else None
        if fn is None:
            fn = getattr(importlib.import_module(f"..kernels.{module}", __package__), attr)
        with _KERNEL_LOCK:
            return fn(*args)

    run.__name__ = run.__qualname__ = name
    return run


@functools.cache
def _blas_single_threaded() -> None:
    """Ask numpy's OpenBLAS for one thread (unless the user chose a count). Its worker
    threads spin while they wait, and beside numba's kernels on 2 loaded cores they made the
    exact inverse's matmuls ~50x slower than one thread (benchmarks/RESULTS.md, "Exact
    transforms"). Only speed: the sums are exact, any thread count writes the same bytes. A
    BLAS without this entry point (not OpenBLAS) is left as it is."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        return
    root = os.path.dirname(os.path.dirname(np.__file__))
    libs = [os.path.join(d, f) for d in (os.path.join(root, "numpy.libs"),
                                         os.path.join(os.path.dirname(np.__file__), ".dylibs"))
            if os.path.isdir(d) for f in sorted(os.listdir(d)) if "openblas" in f.lower()]
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(1))
                return


def _untransform_cpu(kernel, coef, out, tf, cos, sin, gain=None) -> None:
    """`transform.inverse` into out [L, T, C] (fp16 bits, any strides) from the decoded
    coefficients coef (float32 [L, T, C], C-contiguous; overwritten); gain: float32 [L, C] or
    None: coef holds an exact transform's integers, multiplied by gain in place of a basis."""
    if tf.exact:
        _blas_single_threaded()  # the basis in exact integer sums: BLAS, the same bytes anywhere
        coef = intinverse.sums(coef, tf.integer_basis[0], scratch("decode.sums", coef.shape,
                                                                  np.float32))
    n_layer, _, n_ch = coef.shape
    use_gain, use_mean = gain is not None, tf.mean is not None
    use_basis = tf.basis_t is not None and not use_gain
    basis_t = tf.basis_t if use_basis else np.zeros((n_layer, 1, 1, 1), np.float32)
    mean = tf.mean if use_mean else np.zeros((n_layer, n_ch), np.float32)
    gain = gain if use_gain else np.zeros((n_layer, n_ch), np.float32)
    n_rot = 2 * cos.shape[1] if tf.rope != "none" else 0
    kernel(coef, out, basis_t, mean, gain, cos, sin, tf.head_dim, n_rot, tf.rope == "neox",
           use_basis, use_mean, use_gain)


def _untransform_reference(coef, out, tf, cos, sin, gain=None) -> None:
    if tf.exact:
        coef = intinverse.reference_sums(coef, tf.integer_basis[0])
    out[...] = transform.inverse(coef, tf, cos, sin, gain)


@functools.cache
def _cpu(ahead: bool = True) -> SimpleNamespace:
    kernels = {name: _kernel(name, ahead) for name in _JIT}
    return SimpleNamespace(name="cpu", untransform=functools.partial(
        _untransform_cpu, kernels.pop("untransform")), **kernels)


def jit() -> SimpleNamespace:
    """The CPU backend on numba's JIT kernels only: what `precompile` loads them through."""
    return _cpu(ahead=False)


@functools.cache
def get(name: str) -> SimpleNamespace:
    """The backend called `name`."""
    if name == "cpu":
        return _cpu()
    if name == "reference":
        return SimpleNamespace(name="reference", any_nonfinite=reference.any_nonfinite,
                               quantize=reference.quantize,
                               choose_entries=reference.choose_entries,
                               encode=reference.encode, decode=reference.decode,
                               untransform=_untransform_reference,
                               to_channel_major=reference.to_channel_major)
    if name == "cuda":
        from . import cuda

        if not cuda.available():
            raise CodecError("the cuda codec backend was requested but no CUDA device is usable")
        return SimpleNamespace(**{**vars(_cpu()), "name": "cuda", "encode": cuda.encode,
                                  "decode": cuda.decode})
    raise CodecError(f"unknown codec backend {name!r}; known: {', '.join(NAMES)}")


@functools.cache
def active() -> SimpleNamespace:
    """The backend used when none is named: the environment's choice, else the fastest."""
    forced = os.environ.get("KVDESK_CODEC_BACKEND")
    if forced:
        return get(forced)
    if not _cuda_driver_loads():
        return get("cpu")
    from . import cuda

    return get("cuda" if cuda.available() else "cpu")


def _cuda_driver_loads() -> bool:
    """Whether a CUDA driver library loads, or numba's CUDA simulator is on. Importing
    numba.cuda only to learn that there is no GPU cost 0.3-0.9 s of every process's start on
    the 2-core machines; a driver that loads still has numba say whether a device is usable."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return True
    driver = os.environ.get("NUMBA_CUDA_DRIVER")
    names = [driver] if driver else {"win32": ["nvcuda.dll"], "darwin": []}.get(
        sys.platform, ["libcuda.so.1", "libcuda.so"])
    for name in names:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False
