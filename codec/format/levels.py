"""Codec configurations: what a level is, the named levels, and their JSON form.

A `CodecConfig` is plain data (numcodecs-style `get_config()` / `from_config()`); the named
levels live in `level_table.py` as plain data so they can be tuned without touching code.
The config travels inside every blob, so decoding never depends on this table: renaming or
retuning a level changes new blobs only. This module must never hold coding logic.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from ..errors import CodecError
from .level_table import LEVELS

CODEC_ID = "kvdesk.kv"
SCALE_MODES = ("token", "channel", "layer")
MIN_BINS, MAX_BINS = 4, 128  # symbols must fit a byte and a quantizer needs levels on both sides
MAX_LANES = 64
MAX_GROUPS = 256  # layer groups of a kind: calibrated levels give every layer its own bins
CALIBRATED = "calibrated"  # a kind's "transform": its calibration part's transform of the kind


@dataclass(frozen=True)
class KindConfig:
    """Quantization of one tensor kind (keys or values).

    scale: which elements share one symmetric scale (max |x|): "token" = one per (layer,
        token) like CacheGen, "channel" = one per (layer, channel) over the chunk, "layer" = one
        per layer. bins: CacheGen-style bin counts per layer group: maxq = bins // 2 - 1 and
        2 * maxq + 1 symbols (bins - 1 for even bins), x -> rint(x * maxq / scale).
    layer_edges: fractions of depth where the next group starts (len(bins) - 1 of them).
    transform: the kind is coded through the transform of the calibration the config names
        (calibrated/transform.py); False: as it is.
    """

    scale: str
    bins: tuple[int, ...]
    layer_edges: tuple[float, ...]
    transform: bool = False

    def layer_bins(self, n_layer: int) -> np.ndarray:
        """Bin count of every layer: layer l is in the group of edges with l >= round(e * n)."""
        starts = [round(e * n_layer) for e in self.layer_edges]
        group = [sum(1 for s in starts if layer >= s) for layer in range(n_layer)]
        return np.array([self.bins[g] for g in group], dtype=np.int64)

    def get_config(self) -> dict[str, Any]:
        d = {"scale": self.scale, "bins": list(self.bins), "layer_edges": list(self.layer_edges)}
        return {**d, "transform": CALIBRATED} if self.transform else d

    @classmethod
    def from_config(cls, d: Any) -> KindConfig:
        keys = {"scale", "bins", "layer_edges"}
        _expect(isinstance(d, dict) and set(d) in (keys, keys | {"transform"}), d)
        _expect(d.get("transform", CALIBRATED) == CALIBRATED, d)
        scale, bins, edges = d["scale"], d["bins"], d["layer_edges"]
        _expect(scale in SCALE_MODES, scale)
        _expect(isinstance(bins, list) and 1 <= len(bins) <= MAX_GROUPS, bins)
        _expect(all(_is_int(b) and MIN_BINS <= b <= MAX_BINS for b in bins), bins)
        _expect(isinstance(edges, list) and len(edges) == len(bins) - 1, edges)
        _expect(all(isinstance(e, int | float) and not isinstance(e, bool) for e in edges), edges)
        _expect(all(0.0 < e < 1.0 for e in edges) and edges == sorted(edges), edges)
        return cls(scale, tuple(bins), tuple(float(e) for e in edges), "transform" in d)


@dataclass(frozen=True)
class CodecConfig:
    """One codec setting. mode "lossless" keeps fp16 bit-exact; "quantized" uses keys/values.

    lanes: channels of one layer whose streams share one word stream (a group).
    states: rANS states of a group; channel j of the group uses state j % states. Each state
        costs 4 bytes of flush per group and chunk; several give the decoder parallel work.
    sink_tokens: the document's first tokens (attention sinks) are stored exact in fp16.
    anchor_group: 0 = plain; g > 0 = every g-th token is an anchor and the others are coded as
        deltas to their anchor's reconstruction (CacheGen paper style).
    calibration: (SHA-256 hex, part) of the model calibration (calibrated/calibration.py) whose
        transforms the kinds marked `transform` go through, or None: then the blob decodes
        with nothing but itself.
    """

    name: str
    mode: str
    lanes: int = 16
    states: int = 4
    sink_tokens: int = 0
    anchor_group: int = 0
    keys: KindConfig | None = None
    values: KindConfig | None = None
    calibration: tuple[str, int] | None = None

    def get_config(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": CODEC_ID, "name": self.name, "mode": self.mode,
                             "lanes": self.lanes, "states": self.states}
        if self.mode == "quantized":
            d.update(sink_tokens=self.sink_tokens, anchor_group=self.anchor_group,
                     keys=self.keys.get_config(), values=self.values.get_config())
        if self.calibration is not None:
            d["calibration"] = {"id": self.calibration[0], "part": self.calibration[1]}
        return d

    @classmethod
    def from_config(cls, d: Any) -> CodecConfig:
        _expect(isinstance(d, dict) and d.get("id") == CODEC_ID, d)
        name, mode = d.get("name"), d.get("mode")
        lanes, states = d.get("lanes"), d.get("states")
        _expect(isinstance(name, str) and 0 < len(name) <= 64, name)
        _expect(_is_int(lanes) and 1 <= lanes <= MAX_LANES, lanes)
        _expect(_is_int(states) and 1 <= states <= lanes, states)
        common = {"id", "name", "mode", "lanes", "states"}
        if mode == "lossless":
            _expect(set(d) == common, d)
            return cls(name, mode, lanes, states)
        _expect(mode == "quantized", mode)
        quantized = common | {"sink_tokens", "anchor_group", "keys", "values"}
        _expect(set(d) in (quantized, quantized | {"calibration"}), d)
        sink, anchor = d["sink_tokens"], d["anchor_group"]
        _expect(_is_int(sink) and 0 <= sink <= 1 << 20, sink)
        _expect(_is_int(anchor) and (anchor == 0 or 2 <= anchor <= 1 << 16), anchor)
        keys, values = KindConfig.from_config(d["keys"]), KindConfig.from_config(d["values"])
        cal = d.get("calibration")
        if cal is not None:
            _expect(isinstance(cal, dict) and set(cal) == {"id", "part"}, cal)
            _expect(isinstance(cal["id"], str) and len(cal["id"]) == 64
                    and all(ch in "0123456789abcdef" for ch in cal["id"]), cal)
            _expect(_is_int(cal["part"]) and 0 <= cal["part"] < 16, cal)
            cal = (cal["id"], cal["part"])
        # a transform needs the calibration that defines it; deltas are not taken through one
        _expect(cal is not None or not (keys.transform or values.transform), d)
        _expect(anchor == 0 or not (keys.transform or values.transform), d)
        return cls(name, mode, lanes, states, sink, anchor, keys, values, cal)

    def replace(self, **changes: Any) -> CodecConfig:
        """A copy with some top-level fields changed (for tuning experiments)."""
        return CodecConfig.from_config({**self.get_config(), **changes})


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _expect(ok: bool, what: Any) -> None:
    if not ok:
        raise CodecError(f"invalid codec config near {str(what)[:200]!r}")


@cache
def _table() -> dict[str, CodecConfig]:
    return {name: CodecConfig.from_config({"id": CODEC_ID, "name": name, **d})
            for name, d in LEVELS.items()}


def levels() -> dict[str, CodecConfig]:
    """The named levels, best quality first."""
    return dict(_table())


def resolve(level: str | CodecConfig | dict) -> CodecConfig:
    """A level name, a config, or a config dict -> a validated CodecConfig."""
    if isinstance(level, CodecConfig):
        return CodecConfig.from_config(level.get_config())
    if isinstance(level, dict):
        return CodecConfig.from_config(level)
    if isinstance(level, str) and level in _table():
        return _table()[level]
    raise CodecError(f"unknown codec level {level!r}; known: {', '.join(_table())}")
