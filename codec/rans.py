"""Numba CPU kernels of the rANS entropy coder (encode, and decode fused with dequantization).

Format: 32-bit states kept in [2^16, 2^32), 16-bit words, PROB_BITS-bit probabilities. The
channels of one layer are cut into groups of `lanes`; a group's lanes are independent rANS
states interleaved in one word stream in (token, lane) order, which gives the CPU independent
work per step and keeps the per-stream bookkeeping to one word count per group. Groups are
independent: they are the unit of parallelism here and on the GPU.

The decoder trusts nothing it reads from a stream: every word read is bounds-checked against
its group, and a group must end exactly at its last word with every state back at its initial
value, so a corrupt stream can neither read out of bounds nor pass silently. Callers validate
table ids and word counts before calling. These kernels must never allocate per symbol.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .tables import PROB_BITS

RANS_LOW = 1 << 16
SLOT_MASK = (1 << PROB_BITS) - 1


@njit(cache=True)
def group_offsets(counts):
    """Start of every group's words in the concatenated stream ([L * G + 1] int64)."""
    flat = counts.ravel()
    off = np.zeros(flat.size + 1, np.int64)
    for i in range(flat.size):
        off[i + 1] = off[i] + flat[i]
    return off


@njit(parallel=True, cache=True)
def encode(sym, ent, freq, cum, lanes):
    """Symbols [L, T, C] with global entry ids [L, C] -> (words uint16, counts [L, G] uint32)."""
    n_layer, n_tok, n_ch = sym.shape
    n_grp = (n_ch + lanes - 1) // lanes
    cap = lanes * n_tok + 2 * lanes  # at most one word per symbol plus the final states
    buf = np.empty((n_layer * n_grp, cap), np.uint16)
    first = np.empty(n_layer * n_grp, np.int64)
    counts = np.empty((n_layer, n_grp), np.uint32)
    for item in prange(n_layer * n_grp):
        layer, g = item // n_grp, item % n_grp
        c0 = g * lanes
        nl = min(lanes, n_ch - c0)
        x = np.full(nl, RANS_LOW, np.int64)
        pos = cap
        for t in range(n_tok - 1, -1, -1):
            for j in range(nl - 1, -1, -1):
                e = ent[layer, c0 + j]
                s = sym[layer, t, c0 + j]
                f = freq[e, s]
                xj = x[j]
                if xj >= f << (32 - PROB_BITS):
                    pos -= 1
                    buf[item, pos] = xj & 0xFFFF
                    xj >>= 16
                x[j] = ((xj // f) << PROB_BITS) + xj % f + cum[e, s]
        for j in range(nl - 1, -1, -1):
            buf[item, pos - 1] = x[j] & 0xFFFF
            buf[item, pos - 2] = x[j] >> 16
            pos -= 2
        first[item] = pos
        counts[layer, g] = cap - pos
    off = group_offsets(counts)
    words = np.empty(off[-1], np.uint16)
    for item in prange(n_layer * n_grp):
        words[off[item]:off[item + 1]] = buf[item, first[item]:]
    return words, counts


@njit(parallel=True, cache=True)
def decode(words, counts, ent, freq, cum, lut, dq, akey, bkey, out, t0, lanes):
    """Decode every group into out[:, t0:t0 + len(akey), :] (fp16 bits from the dequant
    table dq[L, A, B, S]); returns False when any group is inconsistent."""
    n_layer, n_grp = counts.shape
    n_ch = ent.shape[1]
    n_tok = akey.size
    off = group_offsets(counts)
    ok = np.ones(n_layer * n_grp, np.bool_)
    for item in prange(n_layer * n_grp):
        layer, g = item // n_grp, item % n_grp
        c0 = g * lanes
        nl = min(lanes, n_ch - c0)
        p, end = off[item], off[item + 1]
        if end - p < 2 * nl:
            ok[item] = False
            continue
        x = np.empty(nl, np.int64)
        for j in range(nl):
            x[j] = (np.int64(words[p]) << 16) | words[p + 1]
            p += 2
        table = dq[layer]
        for t in range(n_tok):
            row = table[akey[t]]
            for j in range(nl):
                c = c0 + j
                e = ent[layer, c]
                xj = x[j]
                slot = xj & SLOT_MASK
                s = lut[e, slot]
                xj = freq[e, s] * (xj >> PROB_BITS) + slot - cum[e, s]
                if xj < RANS_LOW:
                    if p >= end:  # ran past its words: corrupt; stop safely
                        ok[item] = False
                        break
                    xj = (xj << 16) | words[p]
                    p += 1
                x[j] = xj
                out[layer, t0 + t, c] = row[bkey[c], s]
            if not ok[item]:
                break
        if p != end:
            ok[item] = False
        for j in range(nl):
            if x[j] != RANS_LOW:
                ok[item] = False
    return ok.all()
