"""What another codebook shape could save: the codec's own symbols and tables, measured.

    .venv/bin/python -m benchmarks.shape_entropy --kv kv4096.npz --calibration cal.kvcl
                                                 [--levels high,balanced,compact]

Encodes the recorded KV in 256-token chunks at each level (calibrated with --calibration) and
captures, for every (layer, channel) stream of every chunk, the quantized symbols and the
codebook table the encoder chose for it (a discretized Gaussian, `codec.kernels.tables`). Per
kind, in bits per element: the empirical entropy of each stream over its chunk (a free, exact
table's rate); the cross-entropy of the table chosen (what the format codes, before rANS's own
overhead); the best table of a family of discretized Laplace shapes on the same grid (centres
on the half-symbol grid, 24 scales, 12-bit probabilities); and the better of the two per stream
(a codebook holding both, its ids one bit wider). The blob's own rate is printed beside them.
"""

from __future__ import annotations

import numpy as np

from codec.kernels.tables import PROB_SCALE

from .context_entropy import captured_levels

# Laplace scales in symbols, geometric like the Gaussian widths (0.15 to 40)
SCALES = np.geomspace(0.15, 40, 24)


def laplace_log2(nsym: int) -> np.ndarray:
    """log2 of the family's tables for an alphabet of nsym: [E, nsym], every probability at
    least 1 / PROB_SCALE as the codec's 12-bit tables keep them."""
    s = np.arange(nsym)
    centres = np.arange(2 * nsym - 1) / 2
    p = np.exp(-np.abs(s[None, None, :] - centres[:, None, None]) / SCALES[None, :, None])
    p = p.reshape(-1, nsym)
    p /= p.sum(1, keepdims=True)
    p = np.maximum(p, 1 / PROB_SCALE)
    return np.log2(p / p.sum(1, keepdims=True))


def rates(sym: np.ndarray, ent: np.ndarray, freq: np.ndarray) -> dict[str, float]:
    """Bits of one chunk's [L, T, C] symbols coded with tables freq[ent] [L, C], and with the
    alternatives (the module's docstring)."""
    n_layer, n_tok, n_ch = sym.shape
    width = freq.shape[1]
    hist = np.zeros((n_layer * n_ch, width))
    streams = sym.transpose(0, 2, 1).reshape(-1, n_tok)
    np.add.at(hist, (np.repeat(np.arange(len(streams)), n_tok), streams.ravel()), 1)
    rows = freq[ent.ravel()]
    nsym = (rows > 0).sum(1)
    out = {"entropy": 0.0, "gaussian (coded)": 0.0, "laplace": 0.0, "best of both": 0.0}
    with np.errstate(divide="ignore", invalid="ignore"):
        p = hist / hist.sum(1, keepdims=True)
        out["entropy"] = float(-np.nansum(hist * np.where(p > 0, np.log2(p), 0)))
        coded = -(hist * np.where(rows > 0, np.log2(rows / PROB_SCALE), 0)).sum(1)
    out["gaussian (coded)"] = float(coded.sum())
    best_laplace = np.empty(len(hist))
    for n in np.unique(nsym):
        at = nsym == n
        best_laplace[at] = -(hist[at, :n] @ laplace_log2(int(n)).T).max(1)
    out["laplace"] = float(best_laplace.sum())
    out["best of both"] = float(np.minimum(coded, best_laplace).sum())
    return out


def main(argv: list[str] | None = None) -> None:
    for level, bits, calls in captured_levels(__doc__.splitlines()[0], argv):
        print(f"{level}: {bits:.3f} bits per element coded")
        for kind, name in enumerate(("keys", "values")):  # each chunk encodes keys, then values
            total: dict[str, float] = {}
            n = 0
            for sym, ent, freq, *_ in calls[kind::2]:
                for k, v in rates(sym.astype(np.int64), np.asarray(ent), freq).items():
                    total[k] = total.get(k, 0.0) + v
                n += sym.size
            print(f"  {name}: " + ", ".join(f"{k} {v / n:.3f}" for k, v in total.items()))


if __name__ == "__main__":
    main()
