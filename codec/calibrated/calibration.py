"""A model's codec calibration: its transforms and its calibrated levels, as immutable bytes.

A `Calibration` holds, for each KV part of a model (one, or two for a sliding-window model:
the full-attention layers and the window layers), the keys' and values' `KindTransform` and
the level configs calibrated for that part (name -> CodecConfig dict). It is identified by the
SHA-256 of its bytes (`id`): a blob encoded with a calibrated level names that id in its
config, and decodes only with exactly that calibration, which the caller hands to `decode`
through a resolver (the codec knows nothing of where calibrations are kept).

Bytes: magic b"KVCL" | u16 version (1, or 2 with an exact transform) | u16 0 | u32 JSON
length | JSON (meta, levels, and for every array its part, kind, name, dtype, shape and
offset) | the arrays, little-endian, 8-byte aligned | u32 CRC-32 of everything before.
`meta` is the caller's JSON object (what was measured, on which model), opaque here. This
module must never unpickle or eval, and never allocate from a size it has not checked against
the bytes it has.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CodecError
from ..format.levels import CodecConfig
from .transform import KindTransform, fit

MAGIC = b"KVCL"
# 2: a kind may be "exact" (its basis inverted in integers, intinverse.py; blocks of any whole
# heads). Written only by calibrations that use it, so version 1 readers refuse those clearly
# and read the others; every version 1 file reads as it did.
VERSION = 2
VERSIONS = (1, 2)
_PRELUDE = struct.Struct("<4sHHI")
_CRC = struct.Struct("<I")
_ARRAYS = ("theta", "mean", "basis")
_DTYPES = {"theta": "<f8", "mean": "<f4", "basis": "<f4"}
MAX_JSON = 1 << 22
KINDS = ("keys", "values")


@dataclass(frozen=True, eq=False)
class Part:
    """One KV part: its shape, its two transforms, and its calibrated levels."""

    n_layer: int
    channels: int
    keys: KindTransform
    values: KindTransform
    levels: dict[str, dict] = field(default_factory=dict)

    def transform(self, kind: str) -> KindTransform:
        return self.keys if kind == "keys" else self.values


@dataclass(frozen=True, eq=False)
class Calibration:
    parts: tuple[Part, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return self._bytes

    @property
    def id(self) -> str:
        """SHA-256 (hex) of the bytes: what blobs name."""
        return hashlib.sha256(self._bytes).hexdigest()

    def config(self, name: str, part: int = 0) -> CodecConfig:
        """The calibrated level `name` of a part, naming this calibration."""
        try:
            d = self.parts[part].levels[name]
        except (IndexError, KeyError):
            raise CodecError(f"the calibration has no level {name!r} for part {part}") from None
        return CodecConfig.from_config({**d, "calibration": {"id": self.id, "part": part}})

    @property
    def level_names(self) -> list[str]:
        return list(self.parts[0].levels) if self.parts else []

    @property
    def _bytes(self) -> bytes:
        cached = self.__dict__.get("_cached")
        if cached is None:
            cached = _pack(self)
            object.__setattr__(self, "_cached", cached)
        return cached

    @classmethod
    def from_bytes(cls, data: bytes) -> Calibration:
        return _unpack(data)


def _pack(cal: Calibration) -> bytes:
    arrays, directory, at = [], [], 0
    parts = []
    for p, part in enumerate(cal.parts):
        kinds = {}
        for kind in KINDS:
            tf = part.transform(kind)
            kinds[kind] = {"head_dim": tf.head_dim, "rope": tf.rope}
            if tf.exact:
                kinds[kind]["exact"] = True
            for name in _ARRAYS:
                a = getattr(tf, name)
                if a is None or (name == "theta" and a.size == 0):
                    continue
                raw = np.ascontiguousarray(a, _DTYPES[name]).tobytes()
                directory.append({"part": p, "kind": kind, "name": name,
                                  "shape": list(a.shape), "offset": at, "nbytes": len(raw)})
                arrays.append(raw + b"\0" * (-len(raw) % 8))
                at += len(arrays[-1])
        parts.append({"n_layer": part.n_layer, "channels": part.channels, "kinds": kinds,
                      "levels": part.levels})
    meta = {"meta": cal.meta, "parts": parts, "arrays": directory}
    text = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-(len(text) + _PRELUDE.size) % 8)
    version = VERSION if any(part.transform(k).exact for part in cal.parts for k in KINDS) \
        else 1
    body = _PRELUDE.pack(MAGIC, version, 0, len(text)) + text + b"".join(arrays)
    return body + _CRC.pack(zlib.crc32(body))


def _unpack(data: bytes) -> Calibration:
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) < _PRELUDE.size + 4:
        raise CodecError("not a kvdesk codec calibration (too short)")
    data = bytes(data)
    magic, version, flags, hlen = _PRELUDE.unpack_from(data, 0)
    if magic != MAGIC:
        raise CodecError("not a kvdesk codec calibration (bad magic)")
    if version not in VERSIONS or flags:
        raise CodecError(f"unsupported calibration version {version}; this build reads "
                         f"{', '.join(map(str, VERSIONS))}")
    if zlib.crc32(data[:-4]) != _CRC.unpack_from(data, len(data) - 4)[0]:
        raise CodecError("calibration checksum mismatch: the calibration is corrupt")
    if hlen > MAX_JSON or _PRELUDE.size + hlen > len(data) - 4:
        raise CodecError("calibration is truncated (header)")
    start = _PRELUDE.size + hlen
    payload = memoryview(data)[start:len(data) - 4]
    try:
        meta = json.loads(data[_PRELUDE.size:start].decode("utf-8"))
        found: dict[tuple[int, str, str], np.ndarray] = {}
        for entry in meta["arrays"]:
            name, shape = entry["name"], tuple(int(n) for n in entry["shape"])
            dtype = np.dtype(_DTYPES[name])
            off, nbytes = int(entry["offset"]), int(entry["nbytes"])
            if nbytes != dtype.itemsize * int(np.prod(shape)) or not (
                    0 <= off and off + nbytes <= len(payload)):
                raise CodecError("calibration array outside its bytes")
            arr = np.frombuffer(payload[off:off + nbytes], dtype).reshape(shape)
            found[(int(entry["part"]), entry["kind"], name)] = arr.astype(dtype.newbyteorder("="))
        parts = []
        for p, pd in enumerate(meta["parts"]):
            tfs = {kind: KindTransform(
                int(pd["kinds"][kind]["head_dim"]), pd["kinds"][kind]["rope"],
                found.get((p, kind, "theta"), np.zeros(0)), found.get((p, kind, "mean")),
                found.get((p, kind, "basis")),
                _exact(pd["kinds"][kind].get("exact", False), version)) for kind in KINDS}
            part = Part(int(pd["n_layer"]), int(pd["channels"]), tfs["keys"], tfs["values"],
                        dict(pd["levels"]))
            for kind in KINDS:
                part.transform(kind).check_shape(part.n_layer, part.channels)
            parts.append(part)
        cal = Calibration(tuple(parts), dict(meta["meta"]))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, CodecError):
            raise
        raise CodecError(f"malformed calibration ({type(e).__name__})") from None
    object.__setattr__(cal, "_cached", data)
    return cal


def _exact(flag: Any, version: int) -> bool:
    if flag not in (True, False) or (flag and version < 2):
        raise CodecError("malformed calibration (exact flag)")
    return flag


def fitted(keys: np.ndarray, values: np.ndarray, level: CodecConfig, name: str,
           head_dim: int = 64, meta: dict | None = None, block: int | None = None) -> Calibration:
    """A calibration fitted on this KV [L, T, C] alone (RoPE as SmolLM2's: "norm", base
    100,000; per-head bases for the keys, means for the values), with one level `name`:
    `level`'s bins through the transforms. block: the keys' basis is instead an exact one
    over blocks of that many channels (intinverse.py; the level must have "layer" scales).
    For tests and for compiling the transform kernels ahead of use (`precompile`); a model's
    real calibration is measured (desktop_app)."""
    theta = 100000.0 ** (-np.arange(0, head_dim, 2) / head_dim)
    kt = fit(keys[:, 1:], 1, head_dim, "norm", theta, basis=True, block=block,
             exact=block is not None)
    vt = fit(values[:, 1:], 1, head_dim)
    cfg = level.get_config()
    for kind in ("keys", "values"):
        cfg[kind] = {**cfg[kind], "transform": "calibrated"}
    return Calibration((Part(keys.shape[0], keys.shape[2], kt, vt, {name: cfg}),), meta or {})
