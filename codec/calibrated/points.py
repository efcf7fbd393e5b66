"""A calibrated level's reconstruction points: where each symbol of a layer decodes.

The quantizer codes a coefficient y as q = rint(y / step), and by default q decodes to its
bin's centre q * step. Coefficients are peaked at zero, so within a bin most of them lie on
the side nearer zero: the bin's mean (its Lloyd-Max point at the same thresholds) is nearer
zero than its centre, and decoding there halves part of the squared error. But an estimate
that minimises squared error spreads less than what it estimates, and the model notices:
attention flattens when the keys' logits spread less, the values' sums shrink (RESULTS,
"Reconstruction at the bins' centroids": 14-39 % worse next-token KLD at the same bits).
So the points are the bins' means scaled, per (kind, layer), back to the coefficients' own
energy: less error, the spread kept (2-11 % less KLD in that measurement).

Points are in units of the step, one row per layer: points[layer, |q|], points[:, 0] = 0,
and -q decodes to -points[|q|]. They are fitted on the calibration's own KV at each level's
bins (`Tally` over the chunks the quantizer made, then `fit`), stored in the calibration and
named by a level's config (`KindConfig.points`); the encoder's symbols do not change. This
module must never import numba, the kernels or the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import CodecError
from ..format.levels import MAX_BINS

WIDTH = MAX_BINS // 2  # |q| <= maxq = bins // 2 - 1 < WIDTH
MIN_COUNT = 20  # a bin seen fewer times keeps its centre: its mean would be noise
MAX_GAIN = 2.0


@dataclass
class Tally:
    """Per layer and |q|: how many coefficients, the sum of |y| / step, the sum of step^2;
    per layer: the sum of y^2."""

    n_layer: int
    counts: np.ndarray = field(init=False)
    sums: np.ndarray = field(init=False)
    step2: np.ndarray = field(init=False)
    energy: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.counts = np.zeros((self.n_layer, WIDTH), np.int64)
        self.sums = np.zeros((self.n_layer, WIDTH))
        self.step2 = np.zeros((self.n_layer, WIDTH))
        self.energy = np.zeros(self.n_layer)

    def add(self, coefficients: np.ndarray, q: np.ndarray, step: np.ndarray) -> None:
        """One chunk of one kind: the coefficients the quantizer saw (float, [L, T, C]), their
        signed symbols q (centred on 0) and the step of each (broadcastable to [L, T, C])."""
        step = np.broadcast_to(step, q.shape).astype(np.float64)
        mag = np.abs(q).astype(np.int64)
        y = np.abs(coefficients.astype(np.float64))
        for layer in range(self.n_layer):
            a, s = mag[layer].ravel(), step[layer].ravel()
            self.counts[layer] += np.bincount(a, minlength=WIDTH)[:WIDTH]
            self.sums[layer] += np.bincount(a, y[layer].ravel() / np.where(s > 0, s, 1),
                                            minlength=WIDTH)[:WIDTH]
            self.step2[layer] += np.bincount(a, s * s, minlength=WIDTH)[:WIDTH]
            self.energy[layer] += float((y[layer] ** 2).sum())


def fit(tally: Tally) -> np.ndarray:
    """The points [L, WIDTH] float32 of a tally: each bin's mean, then one gain per layer
    that gives the reconstruction the coefficients' energy."""
    q = np.arange(WIDTH, dtype=np.float64)
    seen = tally.counts > MIN_COUNT
    mean = np.where(seen, tally.sums / np.maximum(tally.counts, 1), q)
    mean[:, 0] = 0.0
    rec = (mean ** 2 * tally.step2).sum(axis=1)
    gain = np.sqrt(np.divide(tally.energy, rec, out=np.ones_like(rec), where=rec > 0))
    # a layer coded almost all in the zero bin would ask its few points for all its energy
    gain = np.clip(gain, 1 / MAX_GAIN, MAX_GAIN)
    points = np.maximum.accumulate(mean * gain[:, None], axis=1)  # an ordered quantizer
    check(points.astype(np.float32), tally.n_layer)
    return points.astype(np.float32)


def check(points: np.ndarray, n_layer: int) -> None:
    """Refuse points that are not a layer's ordered quantizer (read from a file)."""
    ok = (points.shape == (n_layer, WIDTH) and bool(np.isfinite(points).all())
          and not points[:, 0].any() and bool((np.diff(points, axis=1) >= 0).all())
          and bool((points <= MAX_GAIN * WIDTH).all()))
    if not ok:
        raise CodecError("malformed calibration (reconstruction points)")
