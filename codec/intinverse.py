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

A kind may also give each component its own step, step * 2^m_j with 0 <= m_j <= MAX_SHIFT
(a level's "ranges", levels.KindConfig): the encoder divides the few components whose range
in the chunk exceeds the alphabet at the level's step by the least power of two that fits it
(`component_shifts`), instead of the whole layer taking a coarser step. The decoder multiplies
their integers back (`widen`: exact), so the sums run over q_j * 2^m_j, |q_j 2^m_j| <=
MAX_Q * 2^MAX_SHIFT; their matrices (`integer_basis(basis, MAX_SHIFT)`) keep MAX_SHIFT more
bits of headroom, so every partial sum stays below 2^24 and the bound above holds with
sum_j |q_j| 2^m_j in place of sum_j |q_j|.

This module must never import numba, and never sum non-integers in an unspecified order.
"""

from __future__ import annotations

import numpy as np

from .errors import CodecError

MAX_Q = 63  # levels.MAX_BINS // 2 - 1: the largest |symbol - middle| a quantized kind has
MAX_SHIFT = 3  # a component's step at most 8x its layer's (2 bits per component and chunk)
_LIMIT = 1 << 24  # float32 holds every integer up to here exactly


def integer_basis(basis: np.ndarray, headroom: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(mt, shift) of a float32 basis [L, G, b, b] (u_block = basis @ y_block):
    mt float32 [L, G, b, b] with mt[l, g, j, i] = M[l, g, i, j] (sums = q_block @ mt), integer
    valued, and the shift k int64 [L, G] of each block (M = rint(basis * 2^k)), for integers
    |q_j| <= MAX_Q * 2^headroom (MAX_SHIFT for kinds with per-component steps)."""
    b64 = basis.astype(np.float64)
    top = np.abs(b64).max(axis=(2, 3))
    largest = MAX_Q << headroom
    # start where the largest entry alone would reach 2^24 / largest, then back off one bit at
    # a time until every row's bound holds: frexp, scaling by a power of two and rint are exact
    _, exp = np.frexp(np.where(top > 0, top, 1.0))
    shift = int(np.log2(_LIMIT // largest)) - exp.astype(np.int64)
    while True:
        m = np.rint(np.ldexp(b64, shift[:, :, None, None]))
        bound = np.abs(m).astype(np.int64).sum(axis=3).max(axis=2) * largest
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


def component_shifts(coef: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """m uint8 [L, C]: for each component of a chunk's coefficients [L, T, C], the least
    m <= MAX_SHIFT with max_t |coef| <= ranges[l] * 2^m (ranges [L]: what a layer's alphabet
    covers at its level's step). Exact comparisons only, so every machine picks the same."""
    top = np.abs(coef).max(axis=1).astype(np.float64) if coef.shape[1] else np.zeros(
        (coef.shape[0], coef.shape[2]))
    room = np.asarray(ranges, np.float64)[:, None]
    m = np.zeros(top.shape, np.uint8)
    for k in range(MAX_SHIFT):
        m += top > np.ldexp(room, k)
    return m


def pack_shifts(m: np.ndarray) -> np.ndarray:
    """uint8 [L, ceil(C / 4)]: four 2-bit shifts a byte, component 4i + r in bits 2r, 2r+1."""
    n_layer, n_ch = m.shape
    padded = np.zeros((n_layer, -(-n_ch // 4) * 4), np.uint8)
    padded[:, :n_ch] = m
    quads = padded.reshape(n_layer, -1, 4)
    return (quads[..., 0] | quads[..., 1] << 2 | quads[..., 2] << 4 | quads[..., 3] << 6).astype(
        np.uint8)


def unpack_shifts(packed: np.ndarray, n_ch: int) -> np.ndarray:
    """The shifts [L, n_ch] of `pack_shifts`' bytes; padding bits that are not zero are a
    corrupt blob."""
    m = np.stack([(packed >> (2 * r)) & 3 for r in range(4)], axis=-1).reshape(
        packed.shape[0], -1)
    if np.any(m[:, n_ch:]):
        raise CodecError("codec blob has invalid component shifts")
    return np.ascontiguousarray(m[:, :n_ch])


def widen(q: np.ndarray, m: np.ndarray) -> None:
    """q [L, T, C] float32 integers *= 2^m [L, C] in place (exact: powers of two, and
    |q| 2^m <= MAX_Q * 2^MAX_SHIFT)."""
    q *= np.ldexp(np.float32(1.0), m.astype(np.int32))[:, None, :]


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
