"""Choosing the kernels that run the format: numba CPU, numba CUDA, or the pure reference.

A backend is a plain namespace of the functions of `quant.py` and `rans.py` and an
`untransform(coef, out, KindTransform, cos, sin)` (the inverse transform: on CPU and GPU
the same numba CPU kernel, whose float bytes are pinned to the reference's there). All
backends produce identical bytes, so the choice is only about speed: CUDA when a GPU is
present (rANS on the device, quantization on the CPU kernels), else the CPU kernels.
KVDESK_CODEC_BACKEND=cpu|cuda|reference forces one. This module must never change what a
blob contains.

It also asks OpenMP for a passive wait policy (unless the user chose one): numba's default
OpenMP layer otherwise leaves its worker spinning after every kernel, and on a 2-core machine
that spinning starves the main thread: the codec measured 3-4x slower end to end. This only
takes effect if nothing in the process has started OpenMP yet (llama.cpp also uses it), so an
application should import the codec early or set OMP_WAIT_POLICY itself.
"""

from __future__ import annotations

import functools
import os
import threading
from types import SimpleNamespace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from . import quant, rans, reference, tkernel, transform
from .errors import CodecError

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


def _untransform_cpu(coef, out, tf, cos, sin) -> None:
    with _KERNEL_LOCK:
        tkernel.untransform(coef, out, tf.basis_t, tf.mean, tf.rope, cos, sin, tf.head_dim)


def _untransform_reference(coef, out, tf, cos, sin) -> None:
    out[...] = transform.inverse(coef, tf, cos, sin)


def _cpu() -> SimpleNamespace:
    kernels = ((quant, "any_nonfinite"), (quant, "quantize"), (quant, "choose_entries"),
               (rans, "encode"), (rans, "decode"))
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
                               untransform=_untransform_reference)
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
    from . import cuda

    return get("cuda" if cuda.available() else "cpu")
