"""numba.cuda rANS encode and decode of the format (one GPU thread per group of lanes).

Same inputs, outputs and checks as `kernels.rans.encode` / `kernels.rans.decode`, so the backend
can swap them in; tests run them under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) and require
bit-identical output. Only integer arithmetic and table lookups happen on the device, so
results cannot drift from the CPU. Quantization and table choice stay on the CPU kernels.
Importing it touches no driver (numba compiles and binds lazily); only `available()`,
`encode()` and `decode()` do. It must never change the bytes of the format.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numba import cuda

from ..format.levels import MAX_LANES
from ..kernels.rans import RANS_LOW, SLOT_MASK
from ..kernels.tables import PROB_BITS

THREADS = 64


@cache
def available() -> bool:
    """Whether a CUDA device (or the simulator) is usable."""
    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver install means "no GPU", not a crash
        return False


@cuda.jit
def _kernel(words, off, ent, fc, lut, dq, akey, bkey, out, t0, lanes, states, n_grp, ok):
    item = cuda.grid(1)
    if item >= off.size - 1:
        return
    layer, g = item // n_grp, item % n_grp
    c0 = g * lanes
    nl = min(lanes, ent.shape[1] - c0)
    ns = min(states, nl)
    p, end = off[item], off[item + 1]
    if end - p < 2 * ns:
        ok[item] = 0
        return
    x = cuda.local.array(MAX_LANES, np.int64)
    for j in range(ns):
        x[j] = (np.int64(words[p]) << 16) | words[p + 1]
        p += 2
    for t in range(akey.size):
        a = akey[t]
        i = 0
        for j in range(nl):
            c = c0 + j
            e = ent[layer, c]
            xj = x[i]
            slot = xj & SLOT_MASK
            s = lut[e, slot]
            v = fc[e, s]
            xj = (v & 0xFFFF) * (xj >> PROB_BITS) + slot - (v >> 16)
            if xj < RANS_LOW:
                if p >= end:
                    ok[item] = 0
                    return
                xj = (xj << 16) | words[p]
                p += 1
            x[i] = xj
            out[layer, t0 + t, c] = dq[layer, a, bkey[c], s]
            i = 0 if i + 1 == ns else i + 1
    if p != end:
        ok[item] = 0
    for j in range(ns):
        if x[j] != RANS_LOW:
            ok[item] = 0


@cuda.jit
def _encode_kernel(sym, ent, freq, cum, lanes, states, n_grp, buf, first):
    item = cuda.grid(1)
    if item >= first.size:
        return
    layer, g = item // n_grp, item % n_grp
    c0 = g * lanes
    nl = min(lanes, sym.shape[2] - c0)
    ns = min(states, nl)
    x = cuda.local.array(MAX_LANES, np.int64)
    for i in range(ns):
        x[i] = RANS_LOW
    pos = buf.shape[1]
    for t in range(sym.shape[1] - 1, -1, -1):
        for j in range(nl - 1, -1, -1):
            i = j % ns
            e = ent[layer, c0 + j]
            s = sym[layer, t, c0 + j]
            f = freq[e, s]
            xi = x[i]
            if xi >= f << (32 - PROB_BITS):
                pos -= 1
                buf[item, pos] = xi & 0xFFFF
                xi >>= 16
            x[i] = ((xi // f) << PROB_BITS) + xi % f + cum[e, s]
    for i in range(ns - 1, -1, -1):
        buf[item, pos - 1] = x[i] & 0xFFFF
        buf[item, pos - 2] = x[i] >> 16
        pos -= 2
    first[item] = pos


def encode(sym, ent, freq, cum, recip, lanes, states):
    """`rans.encode` on the GPU (recip is the CPU kernel's speed-up; the GPU divides)."""
    n_layer, n_tok, n_ch = sym.shape
    n_grp = -(-n_ch // lanes)
    n_items = n_layer * n_grp
    cap = lanes * n_tok + 2 * states
    buf = cuda.device_array((n_items, cap), np.uint16)
    first = cuda.device_array(n_items, np.int64)
    blocks = max(1, -(-n_items // THREADS))
    _encode_kernel[blocks, THREADS](cuda.to_device(np.ascontiguousarray(sym)),
                                    cuda.to_device(np.ascontiguousarray(ent)),
                                    _on_device(freq), _on_device(cum), lanes, states, n_grp,
                                    buf, first)
    host, starts = buf.copy_to_host(), first.copy_to_host()
    counts = (cap - starts).astype(np.uint32).reshape(n_layer, n_grp)
    words = np.concatenate([host[i, starts[i]:] for i in range(n_items)])
    return words, counts


_TABLES: dict[int, tuple[np.ndarray, object]] = {}
MAX_CACHED_TABLES = 16


def _on_device(table: np.ndarray):
    """Device copy of a codebook table, kept across calls: codebooks are cached host objects
    of up to a few MB that every chunk of a level uses."""
    hit = _TABLES.get(id(table))
    if hit is None or hit[0] is not table:
        if len(_TABLES) >= MAX_CACHED_TABLES:
            _TABLES.pop(next(iter(_TABLES)))
        hit = _TABLES[id(table)] = (table, cuda.to_device(np.ascontiguousarray(table)))
    return hit[1]


def decode(words, counts, ent, fc, lut, dq, akey, bkey, out, t0, lanes, states):
    """`rans.decode` on the GPU; copies in, decodes, copies `out` back."""
    n_items = counts.size
    off = np.zeros(n_items + 1, np.int64)
    np.cumsum(counts.ravel(), out=off[1:])
    ok = np.ones(n_items, np.uint8)
    dev = [cuda.to_device(np.ascontiguousarray(a)) for a in (words, off, ent)]
    dev += [_on_device(fc), _on_device(lut)]
    dev += [cuda.to_device(np.ascontiguousarray(a)) for a in (dq, akey, bkey, out, ok)]
    blocks = max(1, -(-n_items // THREADS))
    _kernel[blocks, THREADS](*dev[:9], t0, lanes, states, counts.shape[1], dev[9])
    dev[8].copy_to_host(out)
    return bool(dev[9].copy_to_host().all())
