"""The exact inverse of a calibrated basis at BLAS speed: integer matrices, order-free sums.

A basis inverse u = B y summed in float32 depends on the order of its 64-256 additions, so a
BLAS matmul (blocked, vectorized, with or without fused multiply-adds, differently on every
CPU) would write different fp16 bytes on different machines, and the format pins the bytes.
An `exact` transform (transform.KindTransform) is therefore decoded without ever multiplying
by B. Its kinds quantize with one step per layer and chunk ("layer" scale), so every
coefficient is y_j = q_j * step with an integer symbol |q_j| <= MAX_Q, and

    u_i = step * sum_j B_ij q_j  ~=  (step * 2^-k) * sum_j M_ij q_j,   M = rint(B * 2^k),

with M an integer matrix per (layer, block) derived from B by exact elementwise operations
(`integer_basis`) and k the largest shift at which every row has sum_j |M_ij| * MAX_Q < 2^24.
Every partial sum of sum_j M_ij q_j, in any order, is then an integer below 2^24: exact in
float32, so any sgemm (numpy's BLAS here) computes it exactly, and the decoder multiplies by
one float32 gain per (layer, block) after it (`gains`). Rounding B to M moves a reconstructed
element by at most 2^-k-1 * sum_j |q_j| steps (2^-k is ~2^-14 of B's largest entry for
64-channel blocks of an orthonormal B, ~2^-12 for 256: far under the step's own error; the
tests bound it).

This module must never import numba, and never sum non-integers in an unspecified order.
"""

from __future__ import annotations

import numpy as np

from ..errors import CodecError

MAX_Q = 63  # levels.MAX_BINS // 2 - 1: the largest |symbol - middle| a quantized kind has
_LIMIT = 1 << 24  # float32 holds every integer up to here exactly


def integer_basis(basis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mt, shift) of a float32 basis [L, G, b, b] (u_block = basis @ y_block):
    mt float32 [L, G, b, b] with mt[l, g, j, i] = M[l, g, i, j] (sums = q_block @ mt), integer
    valued, and the shift k int64 [L, G] of each block (M = rint(basis * 2^k))."""
    b64 = basis.astype(np.float64)
    top = np.abs(b64).max(axis=(2, 3))
    # start where the largest entry alone would reach 2^24 / MAX_Q, then back off one bit at a
    # time until every row's bound holds: frexp, scaling by a power of two and rint are exact
    _, exp = np.frexp(np.where(top > 0, top, 1.0))
    shift = int(np.log2(_LIMIT // MAX_Q)) - exp.astype(np.int64)
    while True:
        m = np.rint(np.ldexp(b64, shift[:, :, None, None]))
        bound = np.abs(m).astype(np.int64).sum(axis=3).max(axis=2) * MAX_Q
        over = bound >= _LIMIT
        if not over.any():
            break
        shift -= over
    return np.ascontiguousarray(m.swapaxes(2, 3), np.float32), shift


def gains(scales: np.ndarray, maxq: np.ndarray, shift: np.ndarray, block: int) -> np.ndarray:
    """float32 [L, C] factor of every sum: float32(scale_l / maxq_l * 2^-k[l, g]) for the
    channels of block g (scales: fp16 bits [L] of each layer's quantizer scale)."""
    step = scales.view(np.float16).astype(np.float64) / maxq.astype(np.float64)
    g = np.ldexp(step[:, None], -shift).astype(np.float32)
    return np.ascontiguousarray(np.repeat(g, block, axis=1))


def symbol_values(maxq: np.ndarray, width: int) -> np.ndarray:
    """float32 [L, 1, 1, width]: what each symbol decodes to before the sums, its integer
    s - maxq_l (symbols past 2 * maxq cannot occur and decode to 0, as in tables.dequant_lut)."""
    q = np.arange(width, dtype=np.float32)[None, :] - maxq.astype(np.float32)[:, None]
    q[q > maxq[:, None]] = 0
    return np.ascontiguousarray(q[:, None, None, :])


def sums(q: np.ndarray, mt: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out [L, T, C] float32 = the integer sums of every block: q [L, T, C] float32 holding
    the symbols' integers, one sgemm per (layer, block) over the coefficients that are not
    zero throughout the chunk (at 1-2 bits per element a layer-wide basis' weakest 15-45 %
    are: their terms are exact zeros, leaving them out changes no sum)."""
    n_layer, n_tok, n_ch = q.shape
    b = mt.shape[2]
    if mt.shape[:2] != (n_layer, n_ch // b) or n_ch % b:
        raise CodecError(f"an integer basis of shape {mt.shape} does not fit KV {q.shape}")
    used = np.any(q != 0, axis=1)
    for layer in range(n_layer):
        for g in range(n_ch // b):
            cols = slice(g * b, (g + 1) * b)
            nz = np.flatnonzero(used[layer, cols])
            if len(nz) == b:
                np.matmul(q[layer, :, cols], mt[layer, g], out=out[layer, :, cols])
            else:
                np.matmul(q[layer][:, g * b + nz], mt[layer, g, nz], out=out[layer, :, cols])
    return out


def reference_sums(q: np.ndarray, mt: np.ndarray) -> np.ndarray:
    """`sums` in int64 arithmetic (the definition; what the reference backend runs)."""
    n_layer, n_tok, n_ch = q.shape
    b = mt.shape[2]
    qi = q.astype(np.int64).reshape(n_layer, n_tok, n_ch // b, b)
    s = np.einsum("ltgj,lgji->ltgi", qi, mt.astype(np.int64))
    return s.reshape(n_layer, n_tok, n_ch).astype(np.float32)
