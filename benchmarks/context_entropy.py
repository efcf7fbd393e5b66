"""What an entropy coder with contexts could save: the codec's own symbols, measured.

    .venv/bin/python -m benchmarks.context_entropy --kv kv4096.npz --calibration cal.kvcl
                                                   [--levels high,balanced,compact]

Encodes the recorded KV in 256-token chunks at each level (calibrated with --calibration) and
captures the quantized symbols the rANS coder receives. Per kind (keys, values), in bits per
element: the blob's own rate; the empirical entropy of each (layer, channel) stream over each
chunk (what one static table per stream and chunk, as the format codes them, could reach at
best, with no cost for the table); over the whole document; and conditioned on a context:
the previous token's symbol in the same channel (its distance from the channel's mode, 0, 1
or 2+), or the same token's symbol in the channel's RoPE partner (c ^ 1). Contexts are
estimated over the whole document, so they are an upper bound on what they would buy.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import codec
from codec import backend
from codec.bench import load_kv


def entropy_bits(counts: np.ndarray) -> float:
    """Total bits of coding these symbol counts with their own empirical distribution."""
    c = counts[counts > 0].astype(np.float64)
    return float(-(c * np.log2(c / c.sum())).sum())


def context_of(s: np.ndarray) -> np.ndarray:
    """A symbol's distance from its stream's most common symbol: 0, 1 or 2 (2 or more)."""
    return np.minimum(np.abs(s - np.bincount(s).argmax()), 2)


def stream_entropies(sym: np.ndarray) -> dict[str, float]:
    """Bits per element of [L, T, C] symbols under each model (see the module's docstring)."""
    n_layer, n_tok, n_ch = sym.shape
    bits = dict.fromkeys(("per chunk", "per document", "| previous token", "| RoPE partner"),
                         0.0)
    for layer in range(n_layer):
        for c in range(n_ch):
            s = sym[layer, :, c]
            bits["per document"] += entropy_bits(np.bincount(s))
            bits["per chunk"] += sum(entropy_bits(np.bincount(s[t:t + 256]))
                                     for t in range(0, n_tok, 256))
            prev, partner = context_of(s[:-1]), context_of(sym[layer, :, c ^ 1])
            bits["| previous token"] += entropy_bits(np.bincount(s[:1])) + sum(
                entropy_bits(np.bincount(s[1:][prev == k])) for k in range(3))
            bits["| RoPE partner"] += sum(entropy_bits(np.bincount(s[partner == k]))
                                          for k in range(3))
    return {k: round(v / sym.size, 3) for k, v in bits.items()}


def captured_levels(description: str, argv: list[str] | None) -> Iterator[tuple]:
    """Parse --kv, --calibration and --levels; for each level, encode the KV in 256-token
    chunks and yield (level, bits per element coded, the arguments of every call to the rANS
    encoder: each chunk's keys, then its values: (sym, ent, freq, ...))."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--kv", type=Path, required=True)
    ap.add_argument("--calibration", type=Path, help="a .kvcl of the KV's model")
    ap.add_argument("--levels", default="high,balanced,compact")
    args = ap.parse_args(argv)
    keys, values, _ = load_kv(args.kv)
    cal = (codec.Calibration.from_bytes(args.calibration.read_bytes()) if args.calibration
           else None)
    be = backend.jit()
    captured, encode = [], be.encode

    def grab(sym, ent, *rest):
        captured.append((sym.copy(), np.array(ent), *rest))  # (sym: a scratch array, reused)
        return encode(sym, ent, *rest)

    be.encode = grab
    for level in args.levels.split(","):
        captured.clear()
        nbytes = sum(len(codec.encode(keys[:, t:t + 256], values[:, t:t + 256], level,
                                      calibration=cal, first_token=t, backend=be))
                     for t in range(0, keys.shape[1], 256))
        yield level, nbytes * 8 / (keys.size + values.size), list(captured)


def main(argv: list[str] | None = None) -> None:
    for level, bits, calls in captured_levels(__doc__.splitlines()[0], argv):
        print(f"{level}: {bits:.3f} bits per element coded")
        for kind, name in enumerate(("keys", "values")):  # each chunk encodes keys, then values
            sym = np.concatenate([c[0].astype(np.int64) for c in calls[kind::2]], axis=1)
            print(f"  {name}: {stream_entropies(sym)}")


if __name__ == "__main__":
    main()
