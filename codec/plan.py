"""The layout of one quantized kind, derived from its config (scale groups, alphabets,
dequantization tables), and the anchor/delta step around the quantizer.

Plans are cached per (config, shape): a document's chunks share a few. This module must never
run a coding stage itself (pipeline.py wires them) nor hold per-element loops beyond numpy's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .format.levels import KindConfig
from .kernels import tables
from .kernels.tables import F16_TO_F32


@dataclass(frozen=True)
class Plan:
    """Derived layout of one quantized kind: scale groups and alphabet per layer."""

    scale: str
    maxq: np.ndarray
    nsym: np.ndarray
    akey: np.ndarray
    bkey: np.ndarray
    n_a: int
    n_b: int

    @classmethod
    @functools.lru_cache(maxsize=256)  # chunks of a document share plans; callers never write
    def of(cls, kind: KindConfig, n_layer: int, n_tok: int, n_ch: int, group: int) -> Plan:
        maxq = kind.layer_bins(n_layer) // 2 - 1
        resid = (np.arange(n_tok) % group != 0) if group else np.zeros(n_tok, bool)
        if kind.scale == "token":
            akey, n_a = np.arange(n_tok), n_tok
        else:  # anchors and deltas never share a scale
            akey, n_a = resid.astype(np.int64), 2 if group else 1
        if kind.scale == "channel":
            bkey, n_b = np.arange(n_ch), n_ch
        else:
            bkey, n_b = np.zeros(n_ch, np.int64), 1
        return cls(kind.scale, maxq, 2 * maxq + 1, akey, bkey, n_a, n_b)

    @functools.cached_property
    def bank(self) -> tuple[tables.Bank, np.ndarray]:
        """The codebooks of this kind's alphabets and the first entry id of each layer's."""
        bank, base = tables.kind_bank(tuple(self.nsym.tolist()))
        return bank, np.array([base[n] for n in self.nsym.tolist()], np.int64)

    @functools.cached_property
    def n_entries(self) -> np.ndarray:
        """How many codebook entries each layer's alphabet has."""
        return np.array([tables.n_entries(n) for n in self.nsym.tolist()])

    def dequant(self, scales: np.ndarray) -> np.ndarray:
        return tables.dequant_lut(scales, self.maxq, int(self.nsym.max()))


def release_tables() -> None:
    """Forget the per-config plans and codebook tables kept for reuse: a document's chunks
    share a few, but a search over many configs (a calibration) would keep every one it
    tried (tens of MB each)."""
    Plan.of.cache_clear()
    tables.kind_bank.cache_clear()


def residuals(bits: np.ndarray, plan: Plan, group: int, be) -> tuple[np.ndarray, bool]:
    """Anchors as they are; other tokens as fp16(x - reconstruction of their anchor); and
    whether an anchor was not finite (the caller refuses the input).

    A difference beyond the fp16 range (|x| near 65504 with the opposite anchor) becomes Inf
    and is refused like a non-finite input; real KV is orders of magnitude smaller."""
    anchors = np.ascontiguousarray(bits[:, ::group])
    n_anchor = anchors.shape[1]
    if plan.scale == "token":
        akey, n_a = np.arange(n_anchor), n_anchor
    else:
        akey, n_a = np.zeros(n_anchor, np.int64), 1
    sym, scales, _, bad = be.quantize(anchors, plan.maxq, akey, plan.bkey, n_a, plan.n_b,
                                      F16_TO_F32)
    if bad:
        return bits, True
    dq = plan.dequant(scales)
    rec = dq[np.arange(bits.shape[0])[:, None, None], akey[None, :, None],
             plan.bkey[None, None, :], sym]
    ref = np.repeat(rec, group, axis=1)[:, :bits.shape[1]]
    out = (F16_TO_F32[bits] - F16_TO_F32[ref]).astype(np.float16).view(np.uint16)
    out[:, ::group] = anchors
    return out, bad


def apply_anchors(seg: np.ndarray, group: int) -> None:
    """Inverse of `residuals` on decoded fp16 bits, in place."""
    ref = np.repeat(seg[:, ::group], group, axis=1)[:, :seg.shape[1]]
    full = (F16_TO_F32[ref] + F16_TO_F32[seg]).astype(np.float16).view(np.uint16)
    full[:, ::group] = seg[:, ::group]
    seg[...] = full
