"""Numba CPU kernels of the rANS entropy coder (encode, and decode fused with dequantization).

Format: 32-bit states kept in [2^16, 2^32), 16-bit words, PROB_BITS-bit probabilities. The
channels of one layer are cut into groups of `lanes`; each channel is a stream with its own
table, and a group codes its streams in (token, lane) order with `states` interleaved rANS
states (lane j uses state j % states) over one word stream. Several states give the CPU
independent work per step; sharing them across lanes keeps the flush cost (4 bytes a state)
and the bookkeeping (one word count per group) small. Groups are independent: they are the
unit of parallelism here and on the GPU. A group's words are its states' final values
(state 0 first, high word first) followed by the renormalization words in decode order.

The decoder trusts nothing it reads from a stream: every word read is clamped to its group,
and a group must end exactly at its last word with every state back at its initial
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
def encode(sym, ent, freq, cum, recip, lanes, states):
    """Symbols [L, T, C] with global entry ids [L, C] -> (words uint16, counts [L, G] uint32).

    recip = 1 / freq (0 where freq is 0): x // f becomes a float multiply and an exact fix-up.
    """
    n_layer, n_tok, n_ch = sym.shape
    n_grp = (n_ch + lanes - 1) // lanes
    cap = lanes * n_tok + 2 * states  # at most one word per symbol plus the final states
    buf = np.empty((n_layer * n_grp, cap), np.uint16)
    first = np.empty(n_layer * n_grp, np.int64)
    counts = np.empty((n_layer, n_grp), np.uint32)
    for item in prange(n_layer * n_grp):
        layer, g = item // n_grp, item % n_grp
        c0 = g * lanes
        nl = min(lanes, n_ch - c0)
        ns = min(states, nl)
        x = np.full(ns, RANS_LOW, np.int64)
        e = ent[layer, c0:c0 + nl].copy()
        sid = np.arange(nl) % ns  # a lookup, not a division per symbol
        pos = cap
        for t in range(n_tok - 1, -1, -1):
            for j in range(nl - 1, -1, -1):
                ej = e[j]
                s = sym[layer, t, c0 + j]
                f = freq[ej, s]
                xj = x[sid[j]]
                # branch-free renormalization: always store, advance only when it is needed
                emit = xj >= f << (32 - PROB_BITS)
                buf[item, pos - 1] = xj & 0xFFFF
                pos -= emit
                xj >>= 16 * emit
                q = np.int64(xj * recip[ej, s])
                r = xj - q * f
                if r < 0:
                    q -= 1
                    r += f
                elif r >= f:
                    q += 1
                    r -= f
                x[sid[j]] = (q << PROB_BITS) + r + cum[ej, s]
        for j in range(ns - 1, -1, -1):
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
def decode(words, counts, ent, fc, lut, dq, akey, bkey, out, t0, lanes, states):
    """Decode every group into out[:, t0:t0 + len(akey), :]; False when a group is inconsistent.

    fc[e, s] = freq | cum << 16 (one load instead of two); dq[L, A, B, S] (C-contiguous) holds
    the fp16 bits of each symbol's reconstruction for scale group (akey[t], bkey[c]).
    """
    n_layer, n_grp = counts.shape
    n_ch = ent.shape[1]
    n_a, n_b, width = dq.shape[1], dq.shape[2], dq.shape[3]
    flat = dq.reshape(-1)
    off = group_offsets(counts)
    ok = np.ones(n_layer * n_grp, np.bool_)
    for item in prange(n_layer * n_grp):
        layer, g = item // n_grp, item % n_grp
        c0 = g * lanes
        nl = min(lanes, n_ch - c0)
        ns = min(states, nl)
        p, end = off[item], off[item + 1]
        if end - p < 2 * ns:
            ok[item] = False
            continue
        x = np.empty(ns, np.int64)
        for j in range(ns):
            x[j] = (np.int64(words[p]) << 16) | words[p + 1]
            p += 2
        e = np.empty(nl, np.int64)
        lane_dq = np.empty(nl, np.int64)
        sid = np.arange(nl) % ns
        for j in range(nl):
            e[j] = ent[layer, c0 + j]
            lane_dq[j] = bkey[c0 + j] * width
        last = end - 1
        for t in range(akey.size):
            row_dq = (layer * n_a + akey[t]) * n_b * width
            row = out[layer, t0 + t]
            for j in range(nl):
                xj = x[sid[j]]
                ej = e[j]
                slot = xj & SLOT_MASK
                s = lut[ej, slot]
                v = fc[ej, s]
                xj = (v & 0xFFFF) * (xj >> PROB_BITS) + slot - (v >> 16)
                # branch-free: always load a word (clamped to this group), use it if needed;
                # overrunning the group shows as p > end below
                w = words[min(p, last)]
                refill = xj < RANS_LOW
                xj = (xj << (16 * refill)) | (w * refill)
                p += refill
                x[sid[j]] = xj
                row[c0 + j] = flat[row_dq + lane_dq[j] + s]
        if p != end:
            ok[item] = False
        for j in range(ns):
            if x[j] != RANS_LOW:
                ok[item] = False
    return ok.all()
