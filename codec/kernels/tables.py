"""Symbol probability tables and lookup tables shared by every backend.

Quantized streams do not store histograms: each (layer, channel) stream names one entry of a
fixed codebook of discretized Gaussians (centre on the half-symbol grid, 24 widths), so its
table costs an id (2 bytes, about 0.7 once the pipeline deflates a chunk's ids) instead of
the ~66 bytes of a CacheGen histogram. On the default model's
KV, Gaussians code 3-5% smaller than two-sided geometric (Laplace) shapes. The codebook is
part of the format: `backend.reference.codebook_freq` defines it with integer and exactly rounded
float64 arithmetic only (no transcendental functions, whose last bits vary between libms), so
every machine builds the same tables. Lossless planes use explicit per-layer histograms.

Tables must be ready at once in a fresh process (every `kvdesk ask` is one), so they are built
here vectorized, equal to the reference's entry for entry (tested), and the decoder's symbol
lookup table (4 KB an entry, tens of MB for a level's alphabets) is filled only for the
entries a blob names, when it names them (`Bank.lut_for`).

This module must never change the codebook without bumping the container's format version.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from functools import cache, cached_property

import numpy as np

# Every fp16 bit pattern's float32 value: numba has no CPU float16 arithmetic, and numpy's
# conversion of a whole array is slower than this lookup.
F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(
    np.float32)
PROB_BITS = 12
PROB_SCALE = 1 << PROB_BITS
# Widths: weight(d) = rho ** d^2 at d half-symbols from the centre, rho = RHO / 2^20 =
# exp(-1 / (8 sigma^2)) for sigma geometric from 0.15 to 40 symbols, frozen as integers.
RHO_2POW20 = (4054, 34370, 128032, 287548, 473045, 642558, 775792, 871149, 935553, 977521,
              1004271, 1021092, 1031580, 1038087, 1042110, 1044593, 1046124, 1047067, 1047647,
              1048004, 1048224, 1048360, 1048443, 1048494)
N_RHO = len(RHO_2POW20)
COST_FRAC_BITS = 8  # encoder-side code lengths in 1/256 bit; never stored
# |q - round(q)| below this fraction of q: a floor that the total's last bits could move.
# A float64 sum of <= 255 positive terms is within 255 * 2^-53 ~ 3e-14 of the exact one.
_NEAR_INTEGER = 1e-9


class Bank:
    """Tables indexed by a global entry id, made by `make_rows(ids) -> freq rows [n, width]`.

    The encoder's (every row): freq/cum [E, width] int64, recip = ceil(2^32 / freq) (0 where
    freq is 0) and code lengths `cost`. The decoder's: fc = freq | cum << 16 and the slot ->
    symbol lookup table lut [., PROB_SCALE] uint8, built only for the entries blobs name
    (`decoder_tables`), packed in the order they were first named: a fresh process builds a
    few thousand rows (4 KB of lookup table each) in a few contiguous pages instead of a
    level's whole codebooks. `fc` and `lut` as properties hold every row (for a GPU)."""

    def __init__(self, n_rows: int, width: int,
                 make_rows: Callable[[np.ndarray], np.ndarray]) -> None:
        self.width = width
        self._make = make_rows
        self._slot = np.full(n_rows, -1, np.int64)  # entry -> row of the packed tables
        self._n = 0
        # np.empty: rows never built are never touched, so they cost no memory
        self._fc = np.empty((n_rows, width), np.int64)
        self._lut = np.empty((n_rows, PROB_SCALE), np.uint8)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._slot)

    def decoder_tables(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, fc, lut): the packed tables' row of every entry id in `ids` (same shape),
        and the packed tables, with those rows built. The decoder reads no other rows."""
        rows = self._slot[ids]
        if (rows >= 0).all():
            return rows, self._fc, self._lut
        with self._lock:  # another thread may have built some meanwhile
            wanted = np.zeros(len(self._slot), bool)
            wanted[np.asarray(ids).ravel()] = True
            need = np.flatnonzero(wanted & (self._slot < 0))
            if need.size:
                at = slice(self._n, self._n + need.size)
                freq = self._make(need)
                cum = np.zeros_like(freq)
                np.cumsum(freq[:, :-1], axis=1, out=cum[:, 1:])
                self._fc[at] = freq | (cum << 16)
                self._lut[at] = _slots(freq)
                self._slot[need] = np.arange(at.start, at.stop)
                self._n = at.stop
        return self._slot[ids], self._fc, self._lut

    @cached_property
    def freq(self) -> np.ndarray:
        return self._make(np.arange(len(self._slot)))

    @cached_property
    def cum(self) -> np.ndarray:
        cum = np.zeros_like(self.freq)
        np.cumsum(self.freq[:, :-1], axis=1, out=cum[:, 1:])
        return cum

    @cached_property
    def recip(self) -> np.ndarray:
        return np.where(self.freq > 0, -(-(1 << 32) // np.maximum(self.freq, 1)), 0)

    @cached_property
    def cost(self) -> np.ndarray:
        """Code lengths [E, width] in 1/2^COST_FRAC_BITS bit (0 where freq is 0)."""
        return _cost_of()[self.freq]

    @cached_property
    def fc(self) -> np.ndarray:
        return self.freq | (self.cum << 16)

    @cached_property
    def lut(self) -> np.ndarray:
        return _slots(self.freq)


def _slots(freq: np.ndarray) -> np.ndarray:
    """The slot -> symbol lookup rows [n, PROB_SCALE] uint8 of frequency rows [n, width] (each
    summing to PROB_SCALE): one repeat over all of them (a fresh process builds thousands)."""
    symbols = np.tile(np.arange(freq.shape[1], dtype=np.uint8), len(freq))
    return np.repeat(symbols, freq.ravel()).reshape(len(freq), PROB_SCALE)


@cache
def _cost_of() -> np.ndarray:
    with np.errstate(divide="ignore"):
        bits = -np.log2(np.arange(PROB_SCALE + 1) / PROB_SCALE)
    bits[0] = 0
    return np.rint(bits * (1 << COST_FRAC_BITS)).astype(np.int64)


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


def codebook_freq(nsym: int) -> np.ndarray:
    """Frequencies [E, nsym] of the whole codebook for nsym symbols (`codebook_rows`)."""
    return codebook_rows(nsym, np.arange(n_entries(nsym)))


def codebook_rows(nsym: int, ids: np.ndarray) -> np.ndarray:
    """Frequencies [len(ids), nsym] of entries `ids` of the codebook for nsym symbols: those
    of `backend.reference.codebook_freq`, entry k * N_RHO + j centred at k / 2 with width
    RHO_2POW20[j].

    The weights are the same exactly rounded powers (a running product is the reference's
    repeated multiplication); each row's total is a float64 sum, replaced by the exactly
    rounded math.fsum of the reference on the few rows where a floor could depend on it."""
    k, j = ids // N_RHO, ids % N_RHO
    exps = (2 * np.arange(nsym)[None, :] - k[:, None]) ** 2 - (k % 2)[:, None]
    w = _powers((2 * nsym - 2) ** 2)[j[:, None], exps]
    avail = PROB_SCALE - nsym
    total = w.sum(axis=1)
    q = w * avail / total[:, None]
    unsure = np.flatnonzero(((np.abs(q - np.rint(q)) <= _NEAR_INTEGER * q) & (q > 0.5)).any(1))
    if unsure.size:
        total[unsure] = [math.fsum(row) for row in w[unsure].tolist()]
        q[unsure] = w[unsure] * avail / total[unsure, None]
    freq = 1 + np.floor(q).astype(np.int64)
    # the largest weight (the first of equals) takes what rounding left over
    freq[np.arange(len(freq)), w.argmax(axis=1)] += PROB_SCALE - freq.sum(axis=1)
    return freq


_POWERS: list[np.ndarray] = [np.ones((N_RHO, 1))]


def _powers(top: int) -> np.ndarray:
    """rho_j ** e for every width j and 0 <= e <= top (at least), as a running product."""
    have = _POWERS[0]
    if have.shape[1] <= top:  # grown for the largest alphabet yet; shared by smaller ones
        rho = np.array(RHO_2POW20, np.float64) / (1 << 20)
        grown = np.empty((N_RHO, top + 1))
        grown[:, 0] = 1.0
        grown[:, 1:] = rho[:, None]
        np.multiply.accumulate(grown, axis=1, out=grown)
        _POWERS[0] = have = grown
    return have


def explicit(counts: np.ndarray) -> np.ndarray:
    """Histograms [n, S] -> normalized frequencies [n, S] for lossless planes."""
    return np.stack([normalize([float(c) for c in row]) for row in counts])


def bank_of(freq: np.ndarray) -> Bank:
    """A Bank from validated explicit frequencies (each row sums to PROB_SCALE)."""
    freq = freq.astype(np.int64)
    return Bank(len(freq), freq.shape[1], lambda ids: freq[ids])


@cache
def kind_bank(nsyms: tuple[int, ...]) -> tuple[Bank, dict[int, int]]:
    """Codebooks of several alphabet sizes in one bank (rows padded to the largest alphabet)
    and the first global entry id of each alphabet size."""
    sizes = sorted(set(nsyms))
    counts = [n_entries(n) for n in sizes]
    starts = np.cumsum([0, *counts]).tolist()
    width = sizes[-1]

    def make_rows(ids: np.ndarray) -> np.ndarray:
        rows = np.zeros((len(ids), width), np.int64)
        largest = max(n for n, lo, hi in zip(sizes, starts, starts[1:], strict=False)
                      if ((ids >= lo) & (ids < hi)).any())
        _powers((2 * largest - 2) ** 2)  # grown once, for the largest alphabet asked for
        for n, lo, hi in zip(sizes, starts, starts[1:], strict=False):
            pick = (ids >= lo) & (ids < hi)
            if pick.any():
                rows[pick, :n] = codebook_rows(n, ids[pick] - lo)
        return rows

    return Bank(starts[-1], width, make_rows), dict(zip(sizes, starts, strict=False))


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
