"""Numba CPU kernel of the inverse transform: decoded coefficients back to KV.

`untransform` does what `calibrated.transform.inverse` defines, operation for operation in float32
(numba fuses no multiply-adds without fastmath), and rounds to fp16 as numpy does (round to
nearest even, `f16_bits`), so both write identical bytes. It runs after the rANS decoder on
every backend (the GPU decodes symbols; this float step stays on the CPU, where its bytes
are pinned down). It must never allocate per element.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .quant import _f32


@njit(inline="always")
def f16_bits(f):
    """fp16 bits of float32 f, rounded to nearest even (numpy's npy_floatbits_to_halfbits)."""
    x = np.uint32(np.float32(f).view(np.uint32))
    sign = np.uint32((x & np.uint32(0x80000000)) >> np.uint32(16))
    exp = x & np.uint32(0x7F800000)
    sig = x & np.uint32(0x007FFFFF)
    if exp >= np.uint32(0x47800000):  # overflow, Inf or NaN
        if exp == np.uint32(0x7F800000) and sig != 0:
            ret = np.uint32(0x7C00) + (sig >> np.uint32(13))
            return np.uint16(sign + (ret + np.uint32(1) if ret == 0x7C00 else ret))
        return np.uint16(sign + np.uint32(0x7C00))
    if exp <= np.uint32(0x38000000):  # a subnormal half, or zero
        if exp < np.uint32(0x33000000):
            return np.uint16(sign)
        e = exp >> np.uint32(23)
        s = (np.uint32(0x00800000) + sig) >> (np.uint32(113) - e)
        if (s & np.uint32(0x3FFF)) != np.uint32(0x1000) or (x & np.uint32(0x7FF)) != 0:
            s += np.uint32(0x1000)
        return np.uint16(sign + (s >> np.uint32(13)))
    h_exp = (exp - np.uint32(0x38000000)) >> np.uint32(13)
    if (sig & np.uint32(0x3FFF)) != np.uint32(0x1000):
        sig += np.uint32(0x1000)
    return np.uint16(sign + h_exp + (sig >> np.uint32(13)))


_NORMAL_LO = np.uint32(0x38800000)  # float32 |x| from which fp16 is normal ...
_NORMAL_SPAN = np.uint32(0x47800000 - 0x38800000)  # ... up to its overflow


@njit(inline="always")
def _store_row(v, row):
    """row[c] = f16_bits(v[c]): a vectorized fast path for fp16's normal range (round to
    nearest even by adding 0xFFF and the kept part's last bit), then `f16_bits` for the rare
    elements outside it (zeros, subnormals, overflow)."""
    odd = False
    for c in range(v.size):
        x = np.uint32(np.float32(v[c]).view(np.uint32))
        a = x & np.uint32(0x7FFFFFFF)
        h = (a - np.uint32(0x38000000) + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))
             ) >> np.uint32(13)
        row[c] = np.uint16(h | ((x >> np.uint32(16)) & np.uint32(0x8000)))
        odd |= (a - _NORMAL_LO) >= _NORMAL_SPAN
    if odd:
        for c in range(v.size):
            a = np.uint32(np.float32(v[c]).view(np.uint32)) & np.uint32(0x7FFFFFFF)
            if (a - _NORMAL_LO) >= _NORMAL_SPAN:
                row[c] = f16_bits(v[c])


@njit(inline="always")
def _rotate(u, b_t, v, base, d):
    """v[base:base + d] = b_t^T u[base:base + d] (v_i = sum_j b[i, j] u_j, j ascending), four
    terms per pass over v; a zero u_j is skipped (exact: a sum of nonzero terms is never
    -0, and adding +-0 to anything else changes nothing)."""
    for i in range(d):
        v[base + i] = np.float32(0.0)
    j = 0
    while j + 4 <= d:
        y0, y1, y2, y3 = u[base + j], u[base + j + 1], u[base + j + 2], u[base + j + 3]
        if y0 != 0 or y1 != 0 or y2 != 0 or y3 != 0:
            c0, c1, c2, c3 = b_t[j], b_t[j + 1], b_t[j + 2], b_t[j + 3]
            for i in range(d):
                v[base + i] = (((v[base + i] + c0[i] * y0) + c1[i] * y1) + c2[i] * y2) + \
                    c3[i] * y3
        j += 4
    while j < d:
        y = u[base + j]
        if y != 0:
            col = b_t[j]
            for i in range(d):
                v[base + i] = v[base + i] + col[i] * y
        j += 1


@njit(parallel=True, cache=True)
def _untransform(coef, out, basis_t, mean, gain, cos, sin, head_dim, n_rot, neox, use_basis,
                 use_mean, use_gain):
    """KV fp16 bits into out [L, T, C] (any strides) from coef (float32 [L, T, C],
    C-contiguous; overwritten): times basis_t [L, H, d, d] (basis_t[l, h, j, i] =
    basis[l, h, i, j]) if use_basis, or times gain [L, C] if use_gain (an exact transform's
    integer sums); plus mean [L, C] if use_mean; then each head's first n_rot channels turned
    in pairs (neox: half apart, else adjacent) by the float32 cos/sin [T, n_rot / 2]."""
    n_layer, n_tok, n_ch = coef.shape
    n_head = n_ch // head_dim
    half = n_rot // 2
    for layer in prange(n_layer):
        v = np.empty(n_ch, np.float32)
        x = np.empty(n_ch, np.float32)
        m = mean[layer]
        g = gain[layer]
        for t in range(n_tok):
            u = coef[layer, t]  # the decoder's scratch: free to overwrite
            if use_gain:  # an exact transform's integer sums times their block's factor
                for c in range(n_ch):
                    u[c] = u[c] * g[c]
            elif use_basis:
                for h in range(n_head):
                    _rotate(u, basis_t[layer, h], v, h * head_dim, head_dim)
                u = v
            if use_mean:
                for c in range(n_ch):
                    u[c] = u[c] + m[c]
            if half:
                co, si = cos[t], sin[t]
                if n_rot < head_dim:
                    for c in range(n_ch):
                        x[c] = u[c]
                for h in range(n_head):
                    base = h * head_dim
                    if neox:  # pairs (k, k + half): contiguous runs
                        for k in range(half):
                            a, b = base + k, base + k + half
                            x[a] = u[a] * co[k] - u[b] * si[k]
                            x[b] = u[a] * si[k] + u[b] * co[k]
                    else:  # pairs (2k, 2k + 1)
                        for k in range(half):
                            a = base + 2 * k
                            x[a] = u[a] * co[k] - u[a + 1] * si[k]
                            x[a + 1] = u[a] * si[k] + u[a + 1] * co[k]
                u = x
            _store_row(u, out[layer, t])


@njit(parallel=True, cache=True)
def _forward(bits, out, mean, cos, sin, head_dim, n_rot, neox, use_mean):
    n_layer, n_tok, n_ch = bits.shape
    n_head = n_ch // head_dim
    half = n_rot // 2
    for layer in prange(n_layer):
        m = mean[layer]
        for t in range(n_tok):
            src, u = bits[layer, t], out[layer, t]
            for c in range(n_ch):
                u[c] = _f32(src[c])
            if half:
                co, si = cos[t], sin[t]
                for h in range(n_head):
                    base = h * head_dim
                    for k in range(half):
                        a = base + k if neox else base + 2 * k
                        b = a + half if neox else a + 1
                        ua, ub = u[a], u[b]
                        u[a] = ua * co[k] + ub * si[k]
                        u[b] = ub * co[k] - ua * si[k]
            if use_mean:
                for c in range(n_ch):
                    u[c] = u[c] - m[c]


def forward_fast(bits, mean, rope, cos, sin, head_dim):
    """`calibrated.transform.forward` without a basis, for fp16 bits [L, T, C]: RoPE turned
    back and the mean taken off in one pass (the same float32 operations, so the same
    values)."""
    n_layer, n_tok, n_ch = bits.shape
    out = np.empty((n_layer, n_tok, n_ch), np.float32)
    use_mean = mean is not None
    mean = mean if use_mean else np.zeros((n_layer, n_ch), np.float32)
    n_rot = 2 * cos.shape[1] if rope != "none" else 0
    _forward(bits, out, mean, cos, sin, head_dim, n_rot, rope == "neox", use_mean)
    return out

