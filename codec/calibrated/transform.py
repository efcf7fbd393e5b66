"""Calibrated decorrelating transforms of one tensor kind, applied before quantization.

A `KindTransform` turns a run of tokens x [L, T, C] (C = heads * head_dim, positions known)
into coefficients y that code in fewer bits at the same error, and back:

    forward:  u = unrope(x, positions); u -= mean[layer]; y_head = u_head @ basis[layer, head]
    inverse:  u_head = basis[layer, head] @ y_head; u += mean[layer]; x = rope(u, positions)

Every step is optional (rope "none", no mean, no basis). A basis acts on blocks of whole heads:
one head (a per-head KLT) or, for an `exact` transform, any multiple of heads up to the whole
layer (a layer-wide PCA, KVTC-style). RoPE removed from keys makes their
per-channel statistics position-independent: a calibrated mean then takes out what would
otherwise rotate through the channels (per-channel key biases, the outlier channels that
make llama.cpp's q4_0 cache collapse on some models), and a per-head orthonormal basis (KLT,
from the model's own KV) compacts each head's energy into few coefficients. All three are
orthogonal or shifts, so the quantization error keeps its size through the inverse.

The inverse is part of the format: `inverse` here is its definition (numpy, float32, one
operation at a time in a fixed order, no fused multiply-adds) and the numba kernel
(`kernels/tkernel.py`) repeats it operation for operation, so both write identical fp16 bytes. An
`exact` transform's basis is instead inverted in integers (intinverse.py: a BLAS matmul
whose sums are exact, then one gain per block), its kinds quantized with one step per layer;
`inverse` then takes those sums and the gains. The
rotation angles come from `cos_sin`, built from basic float64 arithmetic only, so every machine
turns a position by the same angle. The forward transform runs once in the encoder, shared by
every backend. This module must never import numba.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from ..errors import CodecError
from . import intinverse

ROPE_TYPES = ("none", "norm", "neox")
# pi / 2 in three parts of 33, 33 and 53 bits: n * P1 and n * P2 are exact for |n| < 2^20.
_P1 = 1.5707963267341256
_P2 = 6.077100506303966e-11
_P3 = 2.0222662487959506e-21
_MAX_ANGLE = 1.5e6  # |n| < 2^20 above; positions up to ~1.5M tokens at theta <= 1


@dataclass(frozen=True, eq=False)
class KindTransform:
    """The transform of one kind (keys or values) in one KV part.

    rope: "none", or llama.cpp's "norm" (pairs 2i, 2i+1) / "neox" (pairs i, i + n_rot / 2)
        layout of each head's first n_rot = 2 * len(theta) channels;
    theta: float64 [n_rot / 2], the angle per position of each rotated pair;
    mean: float32 [L, C] or None, subtracted after RoPE is removed;
    basis: float32 [L, G, b, b] or None, orthonormal columns: y_block = u_block @ basis, for
        blocks of b channels (b = head_dim, or for an exact transform any multiple of it);
    exact: the basis is inverted in integers (intinverse.py), not in float32 sums.
    """

    head_dim: int
    rope: str = "none"
    theta: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mean: np.ndarray | None = None
    basis: np.ndarray | None = None
    exact: bool = False

    def __post_init__(self) -> None:
        if self.rope not in ROPE_TYPES:
            raise CodecError(f"unknown RoPE type {self.rope!r}")
        n_rot = 2 * len(self.theta)
        if self.head_dim < 1 or n_rot > self.head_dim or (self.rope == "none") != (n_rot == 0):
            raise CodecError(f"RoPE of {n_rot} channels does not fit heads of {self.head_dim}")
        if not np.all(np.isfinite(self.theta)) or np.any(np.abs(self.theta) > 1.0):
            raise CodecError("RoPE angles must be finite and at most 1 radian per position")
        for name, a in (("mean", self.mean), ("basis", self.basis)):
            if a is not None and (a.dtype != np.float32 or not np.all(np.isfinite(a))):
                raise CodecError(f"a transform's {name} must be finite float32")
        b = self.block
        if self.basis is not None and (self.basis.ndim != 4 or self.basis.shape[3] != b
                                       or b % self.head_dim or (b != self.head_dim
                                                                and not self.exact)):
            raise CodecError(f"basis of shape {self.basis.shape} for heads of {self.head_dim}")
        if self.exact and self.basis is None:
            raise CodecError("an exact transform needs a basis")

    @property
    def block(self) -> int:
        """Channels per basis block (a head without a basis)."""
        return self.head_dim if self.basis is None or self.basis.ndim != 4 else self.basis.shape[2]

    @cached_property
    def integer_basis(self) -> tuple[np.ndarray, np.ndarray]:
        """An exact transform's integer inverse (intinverse.integer_basis: matrices, shifts)."""
        return intinverse.integer_basis(self.basis)

    @cached_property
    def basis_t(self) -> np.ndarray | None:
        """The basis with its last two axes swapped, contiguous (the kernel's layout)."""
        return None if self.basis is None else np.ascontiguousarray(self.basis.swapaxes(2, 3))

    @property
    def identity(self) -> bool:
        return self.rope == "none" and self.mean is None and self.basis is None

    def check_shape(self, n_layer: int, channels: int) -> None:
        """Refuse KV this transform was not calibrated for."""
        ok = channels % self.block == 0
        if self.mean is not None:
            ok &= self.mean.shape == (n_layer, channels)
        if self.basis is not None:
            ok &= self.basis.shape[:2] == (n_layer, channels // self.block)
        if not ok:
            raise CodecError(f"the calibration's transform does not fit KV of {n_layer} layers "
                             f"x {channels} channels")

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Channel indices (a, b) within a head of each rotated pair, in theta's order."""
        half = len(self.theta)
        i = np.arange(half)
        return (2 * i, 2 * i + 1) if self.rope == "norm" else (i, i + half)


def cos_sin(angles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 cos and sin of float64 angles (|a| <= 1.5e6), the same bits on every machine:
    Cody-Waite reduction by pi / 2 and Taylor polynomials, basic float64 operations only."""
    x = np.asarray(angles, np.float64)
    if x.size and np.abs(x).max() > _MAX_ANGLE:
        raise CodecError("a RoPE angle is too large (position beyond ~1.5M tokens)")
    n = np.rint(x * (2 / np.pi))
    r = ((x - n * _P1) - n * _P2) - n * _P3
    r2 = r * r
    s = r.copy()
    c = np.ones_like(r)
    term_s, term_c = r.copy(), np.ones_like(r)
    for k in range(1, 11):  # |r| <= pi / 4: the terms fall below 2^-60 before k = 11
        term_s = term_s * r2 / ((2 * k) * (2 * k + 1))
        term_c = term_c * r2 / ((2 * k - 1) * (2 * k))
        sign = -1.0 if k % 2 else 1.0
        s = s + sign * term_s
        c = c + sign * term_c
    quad = n.astype(np.int64) & 3
    sin = np.choose(quad, [s, c, -s, -c])
    cos = np.choose(quad, [c, -s, -c, s])
    return cos.astype(np.float32), sin.astype(np.float32)


def angles(tf: KindTransform, first_position: int, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [n_tokens, n_pairs] float32 of consecutive positions from first_position."""
    theta = np.asarray(tf.theta, np.float64)
    cos, sin = _angles(theta.tobytes(), first_position, n_tokens)
    return cos.copy(), sin.copy()  # (the kept ones are never handed out to be written)


# Chunks at the same positions recur: every passage of a long document starts where the
# system prompt ends, and a reopened chat's chunks lie where they did. cos_sin's polynomials
# cost ~1 ms a chunk (Gemma 3: 128 pairs), a copy of the kept rows a few microseconds.
@lru_cache(maxsize=64)
def _angles(theta: bytes, first_position: int, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    pos = np.arange(first_position, first_position + n_tokens, dtype=np.float64)
    return cos_sin(pos[:, None] * np.frombuffer(theta, np.float64)[None, :])


def forward(x: np.ndarray, tf: KindTransform, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Coefficients float32 [L, T, C] of x [L, T, C] (any float dtype); the encoder's side."""
    n_layer, n_tok, n_ch = x.shape
    d = tf.head_dim
    u = x.astype(np.float32)
    if tf.rope != "none":
        heads = u.reshape(n_layer, n_tok, n_ch // d, d)
        ua, ub = _pair_views(heads, tf)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        turned_a = ua * c + ub * s  # turned back by the position's angle
        ub *= c
        ub -= ua * s
        ua[...] = turned_a
    if tf.mean is not None:
        u -= tf.mean[:, None, :]
    if tf.basis is not None:
        b = tf.block
        blocks = u.reshape(n_layer, n_tok, n_ch // b, b)
        u = np.einsum("lthi,lhij->lthj", blocks, tf.basis).reshape(n_layer, n_tok, n_ch)
    return np.ascontiguousarray(u, dtype=np.float32)


def _pair_views(heads: np.ndarray, tf: KindTransform) -> tuple[np.ndarray, np.ndarray]:
    """Views [L, T, H, n_pairs] of the first and second channel of every rotated pair."""
    half = len(tf.theta)
    if tf.rope == "norm":
        pairs = heads[..., :2 * half].reshape(*heads.shape[:3], half, 2)
        return pairs[..., 0], pairs[..., 1]
    return heads[..., :half], heads[..., half:2 * half]


def inverse(y: np.ndarray, tf: KindTransform, cos: np.ndarray, sin: np.ndarray,
            gain: np.ndarray | None = None) -> np.ndarray:
    """The format's inverse: coefficients [L, T, C] (float32 holding fp16 values, as decoded)
    -> fp16 bits of the KV. For an exact transform y holds the basis' integer sums instead
    (intinverse.sums) and gain [L, C] their factors (intinverse.gains): u = y * gain.

    Float32 throughout, each product and sum rounded on its own, in this order (the kernel in
    kernels/tkernel.py does exactly the same)."""
    n_layer, n_tok, n_ch = y.shape
    d = tf.head_dim
    u = y.astype(np.float32)
    if tf.exact:
        u = u * gain[:, None, :]
    elif tf.basis is not None:
        heads = u.reshape(n_layer, n_tok, n_ch // d, d)
        acc = np.zeros_like(heads)
        for j in range(d):  # u_i = sum_j basis[i, j] * y_j, j ascending
            acc = acc + tf.basis[:, None, :, :, j] * heads[..., j:j + 1]
        u = acc.reshape(n_layer, n_tok, n_ch)
    if tf.mean is not None:
        u = u + tf.mean[:, None, :]
    if tf.rope != "none":
        a, b = tf.pairs()
        heads = u.reshape(n_layer, n_tok, n_ch // d, d).copy()
        ua, ub = heads[..., a], heads[..., b]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        heads[..., a] = ua * c - ub * s
        heads[..., b] = ua * s + ub * c
        u = heads.reshape(n_layer, n_tok, n_ch)
    return u.astype(np.float16).view(np.uint16)


def fit(x: np.ndarray, first_position: int, head_dim: int, rope: str = "none",
        theta: np.ndarray | None = None, *, mean: bool = True, basis: bool = False,
        block: int | None = None, exact: bool = False) -> KindTransform:
    """A transform calibrated on KV x [L, T, C] of consecutive positions from first_position
    (leave the attention-sink tokens out: they are stored exact and would skew the mean):
    RoPE as given, the mean of each channel after it, and per block of `block` channels
    (default: a head) the eigenvectors of the covariance (largest variance first; signs fixed
    so that each column's largest entry is positive, for a deterministic basis)."""
    plain = KindTransform(head_dim, rope, np.zeros(0) if theta is None else np.asarray(theta))
    u = forward(x, plain, *angles(plain, first_position, x.shape[1])).astype(np.float64)
    n_layer, _, n_ch = u.shape
    m = u.mean(axis=1) if mean else np.zeros((n_layer, n_ch))
    vecs = None
    b = block or head_dim
    if basis:
        centred = (u - m[:, None, :]).reshape(n_layer, -1, n_ch // b, b)
        cov = np.einsum("lthi,lthj->lhij", centred, centred) / max(u.shape[1], 1)
        _, vecs = np.linalg.eigh(cov)
        vecs = vecs[..., ::-1]
        flip = np.take_along_axis(vecs, np.abs(vecs).argmax(axis=2)[:, :, None, :], axis=2)
        vecs = (vecs * np.sign(flip + (flip == 0))).astype(np.float32)
    return KindTransform(head_dim, plain.rope, plain.theta,
                         m.astype(np.float32) if mean else None, vecs, exact and basis)
