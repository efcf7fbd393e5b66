"""Numba CPU kernels of the quantization stage: scales, symbols, and table choice.

Inputs are fp16 bit patterns (uint16) because numba has no CPU float16 arithmetic; a 64K
float32 lookup (`tables.F16_TO_F32`, the reference's) or a few bit operations (`_f32`) convert them
exactly. Every float operation here is mirrored operation for
operation in `backend/reference.py`, so both produce identical symbols. These kernels must never
allocate per element or read outside the arrays they are given.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

EXP_MASK = 0x7C00  # an fp16 with all exponent bits set is Inf or NaN
_TWO_POW_112 = np.float32(2.0**112)
_U = np.uint64  # index type: numba adds no negative-index wraparound to unsigned indices


@njit(parallel=True, cache=True)
def any_nonfinite(bits):
    """True when some fp16 bit pattern in the 3-D array is Inf or NaN."""
    n_layer = bits.shape[0]
    bad = np.zeros(n_layer, np.bool_)
    for layer in prange(n_layer):
        plane = bits[layer]
        for t in range(plane.shape[0]):
            for c in range(plane.shape[1]):
                if plane[t, c] & EXP_MASK == EXP_MASK:
                    bad[layer] = True
    return bad.any()


@njit(inline="always")
def _f32(h):
    """The float32 value of fp16 bits h, exact for every finite fp16 (the same as f32_of[h])
    but without a table lookup, so that loops over elements vectorize: the fp16 exponent and
    mantissa shifted into float32 place, scaled by 2^112 (exact, also for subnormals)."""
    f = np.uint32((np.int32(h) & 0x7FFF) << 13).view(np.float32) * _TWO_POW_112
    return -f if h & 0x8000 else f


def quantize(bits, maxq, akey, bkey, n_a, n_b, f32_of, sym=None, hist=None):
    """Symmetric quantization with one scale per (layer, akey[t], bkey[c]) group.

    scale = max |x| of the group (exact in fp16); symbol = clip(rint(x * maxq / scale)) + maxq
    with the reciprocal taken once per group; a zero scale (all-zero group) gives the middle
    symbol. Returns symbols [L, T, C] uint8, scales [L, A, B] (fp16 bits), the histogram of
    every (layer, channel) stream [L, C, 2 * max(maxq) + 1] (counted here to save the table
    choice a pass over the symbols) and whether any input was Inf or NaN.

    sym and hist, when given, are written instead of new arrays (uint8 [L, T, C] and int64
    [L, C, 2 * max(maxq) + 1], C-contiguous). Fastest on C-contiguous bits: the scale and
    symbol loops then vectorize.
    """
    n_layer, n_tok, n_ch = bits.shape
    if sym is None:
        sym = np.empty((n_layer, n_tok, n_ch), np.uint8)
    if hist is None:
        hist = np.empty((n_layer, n_ch, 2 * int(maxq.max()) + 1), np.int64)
    scales, bad = _quantize(bits, maxq, akey, bkey, n_a, n_b, f32_of, sym, hist)
    return sym, scales, hist, bad


@njit(parallel=True, cache=True)
def _quantize(bits, maxq, akey, bkey, n_a, n_b, f32_of, sym, hist):
    n_layer, n_tok, n_ch = bits.shape
    width = hist.shape[2]
    scales = np.zeros((n_layer, n_a, n_b), np.uint16)
    bad = np.zeros(n_layer, np.bool_)
    for layer in prange(n_layer):
        top = scales[layer]
        for t in range(n_tok):
            a = akey[t]
            row = bits[layer, t]
            if n_b == 1:  # one scale per row: reduce in a register, not through memory
                row_top = np.uint16(0)
                for c in range(n_ch):
                    row_top = max(row_top, np.uint16(row[c] & 0x7FFF))
                top[a, 0] = max(top[a, 0], row_top)
            else:
                for c in range(n_ch):
                    top[a, bkey[c]] = max(top[a, bkey[c]], row[c] & 0x7FFF)
        for a in range(n_a):
            for b in range(n_b):
                if top[a, b] >= EXP_MASK:
                    bad[layer] = True
        mq = np.float32(maxq[layer])
        mid = np.int32(maxq[layer])
        recip = np.zeros((n_a, n_b), np.float32)
        for a in range(n_a):
            for b in range(n_b):
                s = f32_of[top[a, b]]
                if s > 0:
                    recip[a, b] = mq / s
        counts = np.zeros(n_ch * width, np.int32)  # per layer, stays in L1
        row_recip = np.empty(n_ch, np.float32)
        for t in range(n_tok):
            a = akey[t]
            if t == 0 or a != akey[t - 1]:
                for c in range(n_ch):
                    row_recip[c] = recip[a, bkey[c]]
            row, out = bits[layer, t], sym[layer, t]
            for c in range(n_ch):  # vectorized: no table lookup, no histogram here
                q = np.rint(_f32(row[c]) * row_recip[c])
                out[c] = np.int32(min(max(q, -mq), mq)) + mid
            for c in range(n_ch):
                counts[_U(c * width + out[c])] += 1
        for c in range(n_ch):
            for k in range(width):
                hist[layer, c, k] = counts[c * width + k]
    return scales, bad.any()


@njit(parallel=True, cache=True)
def choose_entries(hist, nsym, base, cost, n_rho):
    """Per (layer, channel) stream: a codebook entry with few coded bits, from its histogram.

    Every ratio at the centre on the stream's median, then the two neighbouring half-symbol
    centres at the best ratio and its two neighbours; the first strictly cheapest candidate
    in that order wins. Returns local entry ids [L, C].
    """
    n_layer, n_ch, h_w = hist.shape
    c_w = cost.shape[1]
    hist, cost = hist.reshape(-1), cost.reshape(-1)  # flat: no array views per candidate
    ent = np.empty((n_layer, n_ch), np.int64)
    for layer in prange(n_layer):
        n = nsym[layer]
        for c in range(n_ch):
            h = (layer * n_ch + c) * h_w
            total, acc, med = 0, 0, n - 1
            lo, hi = n, 0  # symbols outside [lo, hi) never occur: they add nothing
            for s in range(n):
                total += hist[h + s]
                if hist[h + s]:
                    lo, hi = min(lo, s), s + 1
            for s in range(n):
                acc += hist[h + s]
                if 2 * acc >= total:
                    med = s
                    break
            lo = min(lo, hi)  # an empty histogram: no terms
            row = base[layer] + 2 * med * n_rho
            best, best_cost = 2 * med * n_rho, stream_cost(hist, h, cost, row * c_w, lo, hi)
            for j in range(1, n_rho):
                bits = stream_cost(hist, h, cost, (row + j) * c_w, lo, hi)
                if bits < best_cost:
                    best, best_cost = 2 * med * n_rho + j, bits
            j_best = best % n_rho
            for k in (2 * med - 1, 2 * med + 1):
                if 0 <= k <= 2 * n - 2:
                    for j in range(max(j_best - 1, 0), min(j_best + 1, n_rho - 1) + 1):
                        at = (base[layer] + k * n_rho + j) * c_w
                        bits = stream_cost(hist, h, cost, at, lo, hi)
                        if bits < best_cost:
                            best, best_cost = k * n_rho + j, bits
            ent[layer, c] = best
    return ent


@njit(inline="always")
def stream_cost(hist, h, cost, at, lo, hi):
    """Coded bits of the histogram hist[h + lo:h + hi] with the code lengths cost[at + lo:]."""
    bits = 0
    for s in range(lo, hi):
        bits += hist[_U(h + s)] * cost[_U(at + s)]
    return bits
