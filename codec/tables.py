"""Symbol probability tables and lookup tables shared by every backend.

Quantized streams do not store histograms: each (layer, channel) stream names one entry of a
fixed codebook of discretized Gaussians (centre on the half-symbol grid, 24 widths), so its
table costs 2 bytes instead of the ~66 bytes of a CacheGen histogram. On the default model's
KV, Gaussians code 3-5% smaller than two-sided geometric (Laplace) shapes. The codebook is
part of the format: it is generated here with integer and exactly rounded float64 arithmetic
only (no transcendental functions, whose last bits vary between libms), so every machine builds
the same tables. Lossless planes use explicit per-layer histograms instead.

This module must never change the codebook without bumping the container's format version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache

import numpy as np

PROB_BITS = 12
PROB_SCALE = 1 << PROB_BITS
# Widths: weight(d) = rho ** d^2 at d half-symbols from the centre, rho = RHO / 2^20 =
# exp(-1 / (8 sigma^2)) for sigma geometric from 0.15 to 40 symbols, frozen as integers.
RHO_2POW20 = (4054, 34370, 128032, 287548, 473045, 642558, 775792, 871149, 935553, 977521,
              1004271, 1021092, 1031580, 1038087, 1042110, 1044593, 1046124, 1047067, 1047647,
              1048004, 1048224, 1048360, 1048443, 1048494)
N_RHO = len(RHO_2POW20)
COST_FRAC_BITS = 8  # encoder-side code lengths in 1/256 bit; never stored


@dataclass(frozen=True)
class Bank:
    """Tables indexed by a global entry id: freq/cum [E, S] int64, lut [E, PROB_SCALE] uint8;
    derived for speed: recip = ceil(2^32 / freq) (0 where freq is 0) for the encoder and
    fc = freq | cum << 16 for the decoder."""

    freq: np.ndarray
    cum: np.ndarray
    lut: np.ndarray

    recip: np.ndarray = field(init=False)
    fc: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        recip = np.where(self.freq > 0, -(-(1 << 32) // np.maximum(self.freq, 1)), 0)
        object.__setattr__(self, "recip", recip)
        object.__setattr__(self, "fc", self.freq | (self.cum << 16))


def normalize(weights: list[float], every: bool = False) -> np.ndarray:
    """Integer frequencies summing to PROB_SCALE; every positive weight (every weight, if
    `every`) gets at least 1."""
    present = [every or w > 0 for w in weights]
    avail = PROB_SCALE - sum(present)
    total = math.fsum(weights)
    freq = [(1 + math.floor(w * avail / total)) if p else 0
            for w, p in zip(weights, present, strict=True)]
    top = max(range(len(weights)), key=lambda s: (weights[s], -s))
    freq[top] += PROB_SCALE - sum(freq)
    return np.array(freq, dtype=np.int64)


def n_entries(nsym: int) -> int:
    return (2 * nsym - 1) * N_RHO


@cache
def codebook(nsym: int) -> tuple[Bank, np.ndarray]:
    """The codebook for an alphabet of nsym symbols and its code lengths [E, nsym] int64.

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
    freq = np.stack(freqs)
    cost = np.rint(-np.log2(freq / PROB_SCALE) * (1 << COST_FRAC_BITS)).astype(np.int64)
    return _bank(freq), cost


def explicit(counts: np.ndarray) -> np.ndarray:
    """Histograms [n, S] -> normalized frequencies [n, S] for lossless planes."""
    return np.stack([normalize([float(c) for c in row]) for row in counts])


def bank_of(freq: np.ndarray) -> Bank:
    """A Bank from validated explicit frequencies (each row sums to PROB_SCALE)."""
    return _bank(freq.astype(np.int64))


def _bank(freq: np.ndarray) -> Bank:
    cum = np.zeros_like(freq)
    np.cumsum(freq[:, :-1], axis=1, out=cum[:, 1:])
    nsym = freq.shape[1]
    lut = np.repeat(np.tile(np.arange(nsym, dtype=np.uint8), len(freq)), freq.ravel())
    return Bank(freq, cum, lut.reshape(len(freq), PROB_SCALE))


@cache
def kind_bank(nsyms: tuple[int, ...]) -> tuple[Bank, np.ndarray, dict[int, int]]:
    """Codebooks of several alphabet sizes concatenated (padded to the largest), with their
    code lengths and the first global entry id of each alphabet size."""
    sizes = sorted(set(nsyms))
    books = [codebook(n) for n in sizes]
    width = sizes[-1]

    def stack(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in arrays])

    starts = np.cumsum([0] + [len(b.freq) for b, _ in books[:-1]]).tolist()
    base = dict(zip(sizes, starts, strict=True))
    bank = Bank(stack([b.freq for b, _ in books]), stack([b.cum for b, _ in books]),
                np.concatenate([b.lut for b, _ in books]))
    return bank, stack([c for _, c in books]), base


def dequant_lut(scales: np.ndarray, maxq: np.ndarray, width: int) -> np.ndarray:
    """fp16 bits of every reconstruction: [L, A, B, width] uint16.

    Symbol s of layer l with scale d decodes to fp16(float32(s - maxq) * (d / maxq)); symbols
    past 2 * maxq cannot occur and decode to 0.
    """
    d = scales.view(np.float16).astype(np.float32) / maxq.astype(np.float32)[:, None, None]
    q = np.arange(width, dtype=np.float32)[None, :] - maxq.astype(np.float32)[:, None]
    vals = (q[:, None, None, :] * d[..., None]).astype(np.float16).view(np.uint16)
    vals[np.broadcast_to(q[:, None, None, :] > maxq[:, None, None, None], vals.shape)] = 0
    return np.ascontiguousarray(vals)
