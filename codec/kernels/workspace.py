"""Per-thread scratch arrays that the encoder reuses from chunk to chunk.

A 256-token chunk of the default model needs ~10 MB of temporaries: a contiguous copy of the
input, symbols, histograms, the rANS encoder's group buffers. Allocated afresh for every
chunk, glibc gives that memory back to the OS when it is freed and the next chunk
page-faults it in again: ~50,000 faults and ~20% of the CPU of encoding a 4,096-token
document. A scratch array is faulted in once per thread and reused.

Only temporaries that never leave a call may live here: nothing a caller receives is a
scratch array, and every user overwrites what it reads. Arrays above MAX_BYTES are not kept,
so one huge encode does not pin its temporaries for the life of the process. This module
must never import numba or anything else from the package.
"""

from __future__ import annotations

import math
import threading

import numpy as np

# Per array. A 256-token kind is 3 MB for the default model and 17 MB for an 8B one with
# 1,024 KV channels; the encoder keeps ~3.5x that per thread. Larger chunks (a whole document
# encoded at once) allocate afresh instead of pinning tens of MB for the thread's lifetime.
MAX_BYTES = 32 << 20

_local = threading.local()


def scratch(name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """An uninitialized C-contiguous array of this shape and dtype; from the same thread, the
    same memory as the last call with this name whenever it fits."""
    dtype = np.dtype(dtype)
    n = math.prod(shape)
    if n * dtype.itemsize > MAX_BYTES:
        return np.empty(shape, dtype)
    kept = _local.__dict__.setdefault("arrays", {})
    buf = kept.get(name)
    if buf is None or buf.size < n * dtype.itemsize:
        buf = kept[name] = np.empty(n * dtype.itemsize, np.uint8)
    return buf[:n * dtype.itemsize].view(dtype).reshape(shape)
