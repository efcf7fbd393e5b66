"""A small pure-NumPy / pure-Python reference of the quantization and rANS kernels.

It defines the format by being obviously correct rather than fast: tests check that the
numba (and CUDA) kernels produce byte-identical output to it on small inputs. Same signatures
as the kernels in `kernels/quant.py` and `kernels/rans.py`. It must never be used on
real-sized data (pure Python loops) and must never import numba.
"""

from __future__ import annotations

import numpy as np

from ..kernels.tables import PROB_BITS, RHO_2POW20, normalize

RANS_LOW = 1 << 16
SLOT_MASK = (1 << PROB_BITS) - 1


def codebook_freq(nsym: int) -> np.ndarray:
    """The codebook for an alphabet of nsym symbols, the format's definition: [E, nsym].

    Entry k * N_RHO + j is centred at k / 2 with width RHO_2POW20[j]. Weights are powers of
    an exact binary fraction computed by repeated multiplication (exactly rounded, so the
    same on every machine), relative to the largest so that none underflows at the centre.
    """
    top = (2 * nsym) ** 2
    powers = []
    for num in RHO_2POW20:
        rho, acc = num / (1 << 20), [1.0]
        for _ in range(top):
            acc.append(acc[-1] * rho)
        powers.append(acc)
    freqs = []
    for k in range(2 * nsym - 1):
        exps = [(2 * s - k) ** 2 - k % 2 for s in range(nsym)]
        for acc in powers:
            freqs.append(normalize([acc[e] for e in exps], every=True))
    return np.stack(freqs)


def any_nonfinite(bits: np.ndarray) -> bool:
    return bool(np.any(bits & 0x7C00 == 0x7C00))


def quantize(bits, maxq, akey, bkey, n_a, n_b, f32_of, sym=None, hist=None):
    n_layer, n_tok, n_ch = bits.shape
    scales = np.zeros((n_layer, n_a, n_b), np.uint16)
    lidx = np.arange(n_layer)[:, None, None]
    aidx, bidx = akey[None, :, None], bkey[None, None, :]
    np.maximum.at(scales, (lidx, aidx, bidx), bits & 0x7FFF)
    mq = maxq.astype(np.float32)[:, None, None]
    s = f32_of[scales]
    recip = np.divide(mq, s, out=np.zeros_like(s), where=s > 0)
    q = np.rint(f32_of[bits] * recip[lidx, aidx, bidx])
    q = np.clip(q, -mq, mq)
    symbols = (q.astype(np.int64) + maxq[:, None, None]).astype(np.uint8)
    width = 2 * int(maxq.max()) + 1
    counts = np.zeros((n_layer, n_ch, width), np.int64)
    for layer in range(n_layer):
        for c in range(n_ch):
            counts[layer, c] = np.bincount(symbols[layer, :, c], minlength=width)
    if sym is not None:  # optional outputs, as in the kernel
        sym[...] = symbols
    if hist is not None:
        hist[...] = counts
    return (symbols if sym is None else sym), scales, (counts if hist is None else hist), \
        any_nonfinite(bits)


def choose_entries(hist, nsym, base, cost, n_rho):
    n_layer, n_ch = hist.shape[:2]
    ent = np.empty((n_layer, n_ch), np.int64)
    for layer in range(n_layer):
        n = int(nsym[layer])
        for c in range(n_ch):
            h = hist[layer, c, :n]
            med = min(int(np.searchsorted(2 * np.cumsum(h), h.sum())), n - 1)
            ids = [2 * med * n_rho + j for j in range(n_rho)]
            first = ids[int(np.argmin(cost[base[layer] + np.array(ids), :n] @ h))]
            j_best = first % n_rho
            centres = [k for k in (2 * med - 1, 2 * med + 1) if 0 <= k <= 2 * n - 2]
            ratios = range(max(j_best - 1, 0), min(j_best + 1, n_rho - 1) + 1)
            ids = [first] + [k * n_rho + j for k in centres for j in ratios]
            ent[layer, c] = ids[int(np.argmin(cost[base[layer] + np.array(ids), :n] @ h))]
    return ent


def encode(sym, ent, freq, cum, recip, lanes, states):  # recip: the kernel's speed-up
    n_layer, n_tok, n_ch = sym.shape
    n_grp = -(-n_ch // lanes)
    streams, counts = [], np.empty((n_layer, n_grp), np.uint32)
    for layer in range(n_layer):
        for g in range(n_grp):
            chans = range(g * lanes, min((g + 1) * lanes, n_ch))
            ns = min(states, len(chans))
            x = [RANS_LOW] * ns
            out: list[int] = []  # written back to front
            for t in reversed(range(n_tok)):
                for j in reversed(range(len(chans))):
                    c, i = chans[j], j % ns
                    e, s = ent[layer, c], sym[layer, t, c]
                    f = int(freq[e, s])
                    if x[i] >= f << (32 - PROB_BITS):
                        out.append(x[i] & 0xFFFF)
                        x[i] >>= 16
                    x[i] = ((x[i] // f) << PROB_BITS) + x[i] % f + int(cum[e, s])
            for i in reversed(range(ns)):
                out += [x[i] & 0xFFFF, x[i] >> 16]
            streams.append(np.array(out[::-1], np.uint16))
            counts[layer, g] = len(out)
    return np.concatenate(streams), counts


def decode(words, counts, ent, fc, lut, dq, akey, bkey, out, t0, lanes, states):
    n_layer, n_grp = counts.shape
    n_ch = ent.shape[1]
    p = 0
    for layer in range(n_layer):
        for g in range(n_grp):
            chans = range(g * lanes, min((g + 1) * lanes, n_ch))
            ns = min(states, len(chans))
            end = p + int(counts[layer, g])
            if end - p < 2 * ns:
                return False
            x = []
            for _ in range(ns):
                x.append((int(words[p]) << 16) | int(words[p + 1]))
                p += 2
            for t, a in enumerate(akey):
                for j, c in enumerate(chans):
                    i, e = j % ns, ent[layer, c]
                    slot = x[i] & SLOT_MASK
                    s = int(lut[e, slot])
                    freq, cum = int(fc[e, s]) & 0xFFFF, int(fc[e, s]) >> 16
                    x[i] = freq * (x[i] >> PROB_BITS) + slot - cum
                    if x[i] < RANS_LOW:
                        if p >= end:
                            return False
                        x[i] = (x[i] << 16) | int(words[p])
                        p += 1
                    out[layer, t0 + t, c] = dq[layer, a, bkey[c], s]
            if p != end or any(v != RANS_LOW for v in x):
                return False
    return True


def to_channel_major(src, dst, lanes):
    dst[...] = src
