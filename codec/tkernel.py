"""Numba CPU kernel of the inverse transform: decoded coefficients back to KV, in place.

`untransform` does what `transform.inverse` defines, operation for operation in float32
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


@njit(parallel=True, cache=True)
def _untransform(out, basis_t, mean, pa, pb, cos, sin, head_dim, use_basis, use_mean):
    n_layer, n_tok, n_ch = out.shape
    n_head = n_ch // head_dim
    n_pair = pa.size
    for layer in prange(n_layer):
        u = np.empty(n_ch, np.float32)
        v = np.empty(n_ch, np.float32)
        for t in range(n_tok):
            row = out[layer, t]
            for c in range(n_ch):
                u[c] = _f32(row[c])
            if use_basis:  # v_i = sum_j basis[i, j] * u_j, j ascending, vectorized over i
                for h in range(n_head):
                    base = h * head_dim
                    for i in range(head_dim):
                        v[base + i] = np.float32(0.0)
                    for j in range(head_dim):
                        y = u[base + j]
                        col = basis_t[layer, h, j]
                        for i in range(head_dim):
                            v[base + i] = v[base + i] + col[i] * y
                for c in range(n_ch):
                    u[c] = v[c]
            if use_mean:
                m = mean[layer]
                for c in range(n_ch):
                    u[c] = u[c] + m[c]
            for c in range(n_ch):
                v[c] = u[c]
            for h in range(n_head):
                base = h * head_dim
                for k in range(n_pair):
                    a, b = base + pa[k], base + pb[k]
                    co, si = cos[t, k], sin[t, k]
                    v[a] = u[a] * co - u[b] * si
                    v[b] = u[a] * si + u[b] * co
            for c in range(n_ch):
                row[c] = f16_bits(v[c])


def untransform(out, basis_t, mean, pa, pb, cos, sin, head_dim):
    """Turn fp16 coefficient bits out [L, T, C] (any strides) into KV bits, in place.

    basis_t: float32 [L, H, d, d] with basis_t[l, h, j, i] = basis[l, h, i, j], or None;
    mean: float32 [L, C] or None; pa, pb: int64 channel pairs within a head rotated by the
    float32 cos/sin [T, n_pairs] (empty for no RoPE)."""
    n_layer, _, n_ch = out.shape
    use_basis, use_mean = basis_t is not None, mean is not None
    basis_t = basis_t if use_basis else np.zeros((n_layer, 1, 1, 1), np.float32)
    mean = mean if use_mean else np.zeros((n_layer, n_ch), np.float32)
    _untransform(out, basis_t, mean, pa, pb, cos, sin, head_dim, use_basis, use_mean)
