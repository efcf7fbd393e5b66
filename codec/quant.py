"""Numba CPU kernels of the quantization stage: scales, symbols, and table choice.

Inputs are fp16 bit patterns (uint16) because numba has no CPU float16 arithmetic; a 64K
float32 lookup converts them exactly. Every float operation here is mirrored operation for
operation in `reference.py`, so both produce identical symbols. These kernels must never
allocate per element or read outside the arrays they are given.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(
    np.float32)
EXP_MASK = 0x7C00  # an fp16 with all exponent bits set is Inf or NaN


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


@njit(parallel=True, cache=True)
def quantize(bits, maxq, akey, bkey, n_a, n_b, f32_of):
    """Symmetric quantization with one scale per (layer, akey[t], bkey[c]) group.

    scale = max |x| of the group (exact in fp16); symbol = clip(rint(x * maxq / scale)) + maxq
    with the reciprocal taken once per group; a zero scale (all-zero group) gives the middle
    symbol. Returns symbols [L, T, C] uint8, scales [L, A, B] (fp16 bits) and whether any
    input was Inf or NaN.
    """
    n_layer, n_tok, n_ch = bits.shape
    sym = np.empty((n_layer, n_tok, n_ch), np.uint8)
    scales = np.zeros((n_layer, n_a, n_b), np.uint16)
    bad = np.zeros(n_layer, np.bool_)
    for layer in prange(n_layer):
        top = scales[layer]
        for t in range(n_tok):
            a = akey[t]
            for c in range(n_ch):
                mag = bits[layer, t, c] & 0x7FFF
                if mag >= EXP_MASK:
                    bad[layer] = True
                if mag > top[a, bkey[c]]:
                    top[a, bkey[c]] = mag
        mq = np.float32(maxq[layer])
        recip = np.zeros((n_a, n_b), np.float32)
        for a in range(n_a):
            for b in range(n_b):
                s = f32_of[top[a, b]]
                if s > 0:
                    recip[a, b] = mq / s
        for t in range(n_tok):
            a = akey[t]
            for c in range(n_ch):
                q = np.rint(f32_of[bits[layer, t, c]] * recip[a, bkey[c]])
                q = min(max(q, -mq), mq)
                sym[layer, t, c] = np.uint8(np.int64(q) + maxq[layer])
    return sym, scales, bad.any()


@njit(parallel=True, cache=True)
def choose_entries(sym, nsym, base, cost, n_rho):
    """Per (layer, channel) stream: the codebook entry with the fewest coded bits.

    Searches every ratio at the three half-integer centres around the stream's median;
    ties go to the lowest entry id. Returns local entry ids [L, C].
    """
    n_layer, n_tok, n_ch = sym.shape
    ent = np.empty((n_layer, n_ch), np.int64)
    for layer in prange(n_layer):
        n = nsym[layer]
        hist = np.zeros((n_ch, n), np.int64)
        for t in range(n_tok):
            for c in range(n_ch):
                hist[c, sym[layer, t, c]] += 1
        for c in range(n_ch):
            acc, med = 0, n - 1
            for s in range(n):
                acc += hist[c, s]
                if 2 * acc >= n_tok:
                    med = s
                    break
            best, best_cost = 0, np.iinfo(np.int64).max
            for k in range(max(2 * med - 1, 0), min(2 * med + 1, 2 * n - 2) + 1):
                for j in range(n_rho):
                    row = base[layer] + k * n_rho + j
                    total = 0
                    for s in range(n):
                        if hist[c, s]:
                            total += hist[c, s] * cost[row, s]
                    if total < best_cost:
                        best, best_cost = k * n_rho + j, total
            ent[layer, c] = best
    return ent
