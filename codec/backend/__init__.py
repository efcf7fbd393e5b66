"""The backend room: the kernels that run the format, numba CPU, numba CUDA or the pure
reference, and the choice between them (here: `get(name)`, `active()`).

    cuda        numba.cuda rANS encode and decode, bit-identical to the CPU kernels
    reference   the pure-NumPy reference of the quantization and rANS kernels: the bytes'
                definition the others are tested against

A backend is a plain namespace of the functions of `kernels/quant.py` and `kernels/rans.py`
and an `untransform(coef, out, KindTransform, cos, sin, gain)` (the inverse transform: on CPU
and GPU the same numba CPU kernel, whose float bytes are pinned to the reference's there; an
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
import os
import sys
import threading
from types import SimpleNamespace

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")

import numpy as np

from ..calibrated import intinverse, transform
from ..errors import CodecError
from ..kernels import quant, rans, tkernel
from ..kernels.workspace import scratch
from . import reference

NAMES = ("cpu", "cuda", "reference")


# One parallel kernel at a time: each already uses every core, and numba's fallback threading
# layer (workqueue, where OpenMP and TBB are missing) aborts the process on concurrent use.
_KERNEL_LOCK = threading.Lock()


def _serialized(kernel):
    @functools.wraps(kernel)
    def run(*args):
        with _KERNEL_LOCK:
            return kernel(*args)

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


def _untransform_cpu(coef, out, tf, cos, sin, gain=None) -> None:
    if tf.exact:
        _blas_single_threaded()  # the basis in exact integer sums: BLAS, the same bytes anywhere
        coef = intinverse.sums(coef, tf.integer_basis[0], scratch("decode.sums", coef.shape,
                                                                  np.float32))
    with _KERNEL_LOCK:
        tkernel.untransform(coef, out, tf.basis_t, tf.mean, tf.rope, cos, sin, tf.head_dim,
                            gain)


def _untransform_reference(coef, out, tf, cos, sin, gain=None) -> None:
    if tf.exact:
        coef = intinverse.reference_sums(coef, tf.integer_basis[0])
    out[...] = transform.inverse(coef, tf, cos, sin, gain)


def _cpu() -> SimpleNamespace:
    kernels = ((quant, "any_nonfinite"), (quant, "quantize"), (quant, "choose_entries"),
               (rans, "encode"), (rans, "decode"), (rans, "to_channel_major"))
    return SimpleNamespace(name="cpu", untransform=_untransform_cpu,
                           **{name: _serialized(getattr(module, name))
                              for module, name in kernels})


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
