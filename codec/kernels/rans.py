"""Numba CPU kernels of the rANS entropy coder (encode, and decode fused with dequantization).

Format: 32-bit states kept in [2^16, 2^32), 16-bit words, PROB_BITS-bit probabilities. The
channels of one layer are cut into groups of `lanes`; each channel is a stream with its own
table, and a group codes its streams in (token, lane) order with `states` interleaved rANS
states (lane j uses state j % states) over one word stream. Several states give the CPU
independent work per step; sharing them across lanes keeps the flush cost (4 bytes a state)
and the bookkeeping (one word count per group) small. Groups are independent: they are the
unit of parallelism here and on the GPU. A group's words are its states' final values
(state 0 first, high word first) followed by the renormalization words in decode order.

The decoder trusts nothing it reads from a stream: every word read stays inside its group
(clamped on the rows that could leave it), and a group must end exactly at its last word with
every state back at its initial value, so a corrupt stream can neither read out of bounds nor
pass silently. Callers validate table ids and word counts before calling. These kernels must
never allocate per symbol.

Speed (measured in benchmarks/RESULTS.md, "Codec"): one coding step is an inlined function
shared by two loops over a group's symbols, one for 4 states held in registers (every named
level) and one for any other count, with the states in a small array (slower: they go
through memory). Tables are indexed flat with unsigned indices, which spares numba's
negative-index wraparound on every lookup; renormalization is branch-free; the encoder
divides with an integer reciprocal; the decoder writes a channel-major output through a
per-group tile, and `to_channel_major` copies a token-major KV (the inverse transform's
output) into such a view the same way.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .tables import PROB_BITS
from .workspace import scratch

RANS_LOW = 1 << 16
SLOT_MASK = (1 << PROB_BITS) - 1
FAST_STATES = 4  # the state count with register-held loops
_U = np.uint64  # index type: numba adds no negative-index wraparound to unsigned indices


@njit(cache=True)
def group_offsets(counts):
    """Start of every group's words in the concatenated stream ([L * G + 1] int64)."""
    flat = counts.ravel()
    off = np.zeros(flat.size + 1, np.int64)
    for i in range(flat.size):
        off[i + 1] = off[i] + flat[i]
    return off


@njit(inline="always")
def _encode_step(x, f, cum, recip, buf, pos):
    """Push one symbol (frequency f, cumulative cum) onto state x; words go down buf from
    pos. x // f is a multiply by recip = ceil(2^32 / f), a shift and an exact fix-up."""
    # branch-free renormalization: always store, advance only when it is needed
    emit = x >= f << (32 - PROB_BITS)
    buf[_U(pos - 1)] = x & 0xFFFF
    pos -= emit
    x >>= 16 * emit
    # x < f * 2^20 <= 2^32 here, so x * recip fits 64 unsigned bits and overshoots x / f by
    # less than 1: the estimate is the quotient or one more (then the remainder is negative)
    q = np.int64((np.uint64(x) * np.uint64(recip)) >> np.uint64(32))
    r = x - q * f
    over = r >> 63  # -1 when the estimate was one too many, else 0
    return ((q + over) << PROB_BITS) + r + (f & over) + cum, pos


@njit(cache=True)
def _encode_rows(x, sym, layer, c0, nl, at, freq, cum, recip, buf):
    """Encode one group, sym[layer, :, c0:c0 + nl] (last symbol first), with the states x,
    which it updates; at[j] = where lane j's table row starts in the flat tables. Returns
    where the words start in buf."""
    ns = x.size
    pos = buf.size
    for t in range(sym.shape[1] - 1, -1, -1):
        row = sym[layer, t, c0:c0 + nl]  # contiguous when sym is: known to the compiler
        i = (nl - 1) % ns
        for j in range(nl - 1, -1, -1):
            k = _U(at[_U(j)] + row[_U(j)])
            x[i], pos = _encode_step(x[i], freq[k], cum[k], recip[k], buf, pos)
            i = ns - 1 if i == 0 else i - 1
    return pos


@njit(cache=True)
def _encode_rows4(x, sym, layer, c0, nl, at, freq, cum, recip, buf):
    """`_encode_rows` for 4 states and a multiple of 4 lanes, with the states in registers."""
    x0, x1, x2, x3 = x[0], x[1], x[2], x[3]
    pos = buf.size
    for t in range(sym.shape[1] - 1, -1, -1):
        row = sym[layer, t, c0:c0 + nl]
        for j in range(nl - 4, -1, -4):
            k = _U(at[_U(j + 3)] + row[_U(j + 3)])
            x3, pos = _encode_step(x3, freq[k], cum[k], recip[k], buf, pos)
            k = _U(at[_U(j + 2)] + row[_U(j + 2)])
            x2, pos = _encode_step(x2, freq[k], cum[k], recip[k], buf, pos)
            k = _U(at[_U(j + 1)] + row[_U(j + 1)])
            x1, pos = _encode_step(x1, freq[k], cum[k], recip[k], buf, pos)
            k = _U(at[_U(j)] + row[_U(j)])
            x0, pos = _encode_step(x0, freq[k], cum[k], recip[k], buf, pos)
    x[0], x[1], x[2], x[3] = x0, x1, x2, x3
    return pos


def encode(sym, ent, freq, cum, recip, lanes, states):
    """Symbols [L, T, C] with global entry ids [L, C] -> (words uint16, counts [L, G] uint32).

    recip = ceil(2^32 / freq) (0 where freq is 0): x // f becomes an integer multiply, a shift
    and an exact fix-up.
    """
    n_layer, n_tok, n_ch = sym.shape
    n_grp = -(-n_ch // lanes)
    # every group writes its words down from the end of its row: at most one per symbol
    # plus the final states
    buf = scratch("rans.encode", (n_layer * n_grp, lanes * n_tok + 2 * states), np.uint16)
    return _encode(sym, ent, freq, cum, recip, lanes, states, buf)


@njit(parallel=True, cache=True)
def _encode(sym, ent, freq, cum, recip, lanes, states, buf):
    n_layer, n_tok, n_ch = sym.shape
    n_grp = (n_ch + lanes - 1) // lanes
    cap = buf.shape[1]
    first = np.empty(n_layer * n_grp, np.int64)
    counts = np.empty((n_layer, n_grp), np.uint32)
    width = freq.shape[1]
    freq, cum, recip = freq.reshape(-1), cum.reshape(-1), recip.reshape(-1)
    for item in prange(n_layer * n_grp):
        layer, g = item // n_grp, item % n_grp
        c0 = g * lanes
        nl = min(lanes, n_ch - c0)
        ns = min(states, nl)
        x = np.full(ns, RANS_LOW, np.int64)
        at = ent[layer, c0:c0 + nl] * width
        group = (x, sym, layer, c0, nl, at, freq, cum, recip, buf[item])
        if ns == FAST_STATES and nl % FAST_STATES == 0:
            pos = _encode_rows4(*group)
        else:
            pos = _encode_rows(*group)
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


@njit(inline="always")
def _decode_step(x, lut_at, fc_at, lut, fc, words, p, last, clamp):
    """Pop one symbol from state x: (new x, new word position p, symbol). clamp: whether the
    word read may need clamping to last (a constant: the check disappears where it is False)."""
    slot = x & SLOT_MASK
    s = lut[_U(lut_at + slot)]
    v = fc[_U(fc_at + s)]
    x = (v & 0xFFFF) * (x >> PROB_BITS) + slot - (v >> 16)
    # branch-free: always load a word (clamped to this group), use it if needed;
    # overrunning the group shows as p > end in the caller. Written as a select, LLVM makes
    # it one cmov (a shift by 16 * refill and a multiply by it took 6 more instructions per
    # 4 symbols and spilled 4 more registers: decode 1.06-1.27x slower).
    refill = x < RANS_LOW
    w = words[_U(min(p, last) if clamp else p)]
    x = ((x << 16) | w) if refill else x
    return x, p + refill, s


@njit(cache=True)
def _decode_rows(x, p, last, at, words, lut, fc, dq, tok_dq, out, layer, t0, c0, nl):
    """Decode one group into out[layer, t0:t0 + T, c0:c0 + nl] (fp16 bits) from words[p:]
    (clamped to last) with the states x, which it updates. at[3j:3j + 3] = where lane j's lut,
    fc and dq rows start in the flat tables, tok_dq[t] = the offset of token t's dq row.
    Returns the position after the last word read."""
    ns = x.size
    for t in range(tok_dq.size):
        row = out[layer, t0 + t, c0:c0 + nl]  # contiguous when out is: known to the compiler
        d = tok_dq[t]
        i = 0
        for j in range(nl):
            a = 3 * j
            x[i], p, s = _decode_step(x[i], at[_U(a)], at[_U(a + 1)], lut, fc, words, p, last,
                                      True)
            row[_U(j)] = dq[_U(d + at[_U(a + 2)] + s)]
            i = 0 if i + 1 == ns else i + 1
    return p


@njit(inline="always")
def _decode_row4(x0, x1, x2, x3, p, last, clamp, at, words, lut, fc, dq, d, row):
    """One token's lanes with the 4 states in registers; see `_decode_rows`."""
    for j in range(0, row.size, 4):
        a = 3 * j
        x0, p, s = _decode_step(x0, at[_U(a)], at[_U(a + 1)], lut, fc, words, p, last, clamp)
        row[_U(j)] = dq[_U(d + at[_U(a + 2)] + s)]
        x1, p, s = _decode_step(x1, at[_U(a + 3)], at[_U(a + 4)], lut, fc, words, p, last, clamp)
        row[_U(j + 1)] = dq[_U(d + at[_U(a + 5)] + s)]
        x2, p, s = _decode_step(x2, at[_U(a + 6)], at[_U(a + 7)], lut, fc, words, p, last, clamp)
        row[_U(j + 2)] = dq[_U(d + at[_U(a + 8)] + s)]
        x3, p, s = _decode_step(x3, at[_U(a + 9)], at[_U(a + 10)], lut, fc, words, p, last, clamp)
        row[_U(j + 3)] = dq[_U(d + at[_U(a + 11)] + s)]
    return x0, x1, x2, x3, p


@njit(cache=True)
def _decode_rows4(x, p, last, at, words, lut, fc, dq, tok_dq, out, layer, t0, c0, nl):
    """`_decode_rows` for 4 states and a multiple of 4 lanes, with the states in registers."""
    x0, x1, x2, x3 = x[0], x[1], x[2], x[3]
    for t in range(tok_dq.size):
        row = out[layer, t0 + t, c0:c0 + nl]  # contiguous when out is: known to the compiler
        d = tok_dq[t]
        if p + nl <= last:  # a row reads at most nl words: this one cannot leave the group
            x0, x1, x2, x3, p = _decode_row4(x0, x1, x2, x3, p, last, False, at, words, lut,
                                             fc, dq, d, row)
        else:
            x0, x1, x2, x3, p = _decode_row4(x0, x1, x2, x3, p, last, True, at, words, lut, fc,
                                             dq, d, row)
    x[0], x[1], x[2], x[3] = x0, x1, x2, x3
    return p


@njit(cache=True)
def _decode_group(x, p, last, tables, out, layer, t0, c0, nl):
    if x.size == FAST_STATES and nl % FAST_STATES == 0:
        return _decode_rows4(x, p, last, *tables, out, layer, t0, c0, nl)
    return _decode_rows(x, p, last, *tables, out, layer, t0, c0, nl)


@njit(inline="always")
def _copy_columns(src, dst):
    """dst[:, :] = src (both [T, n]) one column at a time: dst channel-major writes each
    column contiguously, and src's columns (a tile) stay in cache."""
    for j in range(src.shape[1]):
        for t in range(src.shape[0]):
            dst[_U(t), _U(j)] = src[_U(t), _U(j)]


@njit(parallel=True, cache=True)
def to_channel_major(src, dst, lanes):
    """dst[...] = src for KV [L, T, C], src token-major, dst channel-major (strides[1] <
    strides[2]): in blocks of `lanes` channels, as the decoder writes its tiles."""
    n_layer, _, n_ch = src.shape
    n_grp = (n_ch + lanes - 1) // lanes
    for item in prange(n_layer * n_grp):
        layer, c0 = item // n_grp, item % n_grp * lanes
        c1 = min(c0 + lanes, n_ch)
        _copy_columns(src[layer, :, c0:c1], dst[layer, :, c0:c1])


@njit(parallel=True, cache=True)
def decode(words, counts, ent, fc, lut, dq, akey, bkey, out, t0, lanes, states):
    """Decode every group into out[:, t0:t0 + len(akey), :]; False when a group is inconsistent.

    fc[e, s] = freq | cum << 16 (one load instead of two); dq[L, A, B, S] (C-contiguous) holds
    the fp16 bits of each symbol's reconstruction for scale group (akey[t], bkey[c]). The
    tables must be C-contiguous (they are read flat).
    """
    n_layer, n_grp = counts.shape
    n_ch = ent.shape[1]
    n_a, n_b, width = dq.shape[1], dq.shape[2], dq.shape[3]
    lut_w, fc_w = lut.shape[1], fc.shape[1]
    dq, lut, fc = dq.reshape(-1), lut.reshape(-1), fc.reshape(-1)
    tok_dq = akey * (n_b * width)
    # Channel-major out (llama.cpp keeps V so without flash attention): written straight, every
    # symbol would touch another cache line and page (decoding V took 1.8x the time), so a
    # group goes to a small tile first, then to out one channel at a time.
    channel_major = out.strides[1] < out.strides[2]
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
        at = np.empty(3 * nl, np.int64)
        for j in range(nl):
            at[3 * j] = ent[layer, c0 + j] * lut_w
            at[3 * j + 1] = ent[layer, c0 + j] * fc_w
            at[3 * j + 2] = (layer * n_a * n_b + bkey[c0 + j]) * width
        tables = (at, words, lut, fc, dq, tok_dq)
        if channel_major:
            tile = np.empty((1, tok_dq.size, nl), out.dtype)
            p = _decode_group(x, p, end - 1, tables, tile, 0, 0, 0, nl)
            _copy_columns(tile[0], out[layer, t0:t0 + tok_dq.size, c0:c0 + nl])
        else:
            p = _decode_group(x, p, end - 1, tables, out, layer, t0, c0, nl)
        if p != end:
            ok[item] = False
        for j in range(ns):
            if x[j] != RANS_LOW:
                ok[item] = False
    return ok.all()
