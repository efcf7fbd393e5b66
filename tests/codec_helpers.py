"""Shared helpers of the codec tests: sample KV, an independent error bound, blob surgery."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from codec import Calibration, CodecConfig, levels
from codec.calibrated.calibration import fitted
from codec.format.levels import KindConfig

FIXTURES = Path(__file__).parent / "fixtures" / "codec"
REAL_KV = FIXTURES / "real_kv.npz"


def random_kv(shape: tuple[int, int, int], seed: int = 0, scale: float = 1.0):
    """Keys with per-channel offsets and outliers, values plain Gaussian, like real KV."""
    rng = np.random.default_rng(seed)
    n_layer, n_tok, n_ch = shape
    offset = rng.standard_normal((n_layer, 1, n_ch)) * 3
    keys = (rng.standard_normal(shape) + offset) * scale
    values = rng.standard_normal(shape) * scale * 0.5
    return keys.astype(np.float16), values.astype(np.float16)


def real_kv(n_tokens: int | None = None):
    with np.load(REAL_KV) as z:
        return z["keys"][:, :n_tokens].copy(), z["values"][:, :n_tokens].copy()


def group_max(x: np.ndarray, kind: KindConfig, resid: np.ndarray) -> np.ndarray:
    """max |x| of each element's scale group, broadcast to x's shape (independent of codec)."""
    a = np.abs(x.astype(np.float32))
    if kind.scale == "token":
        return np.broadcast_to(a.max(axis=2, keepdims=True), a.shape)
    out = np.empty_like(a)
    for flag in (False, True):
        sel = resid == flag
        if sel.any():
            axes = (1,) if kind.scale == "channel" else (1, 2)
            out[:, sel] = a[:, sel].max(axis=axes, keepdims=True)
    return out


def error_bound(x: np.ndarray, xhat: np.ndarray, kind: KindConfig) -> np.ndarray:
    """Per-element bound for plain (non-delta) quantization of one kind.

    Rounding to the nearest of 2 * maxq + 1 symmetric levels over [-s, s] errs by at most
    s / (2 * maxq); float32 reciprocal rounding adds a relative 1e-6; rounding the
    reconstruction to fp16 adds half an ulp (2^-11 relative, or 2^-25 absolute if subnormal).
    """
    s = group_max(x, kind, np.zeros(x.shape[1], bool))
    maxq = (kind.layer_bins(x.shape[0]) // 2 - 1).astype(np.float32)[:, None, None]
    return s / (2 * maxq) * (1 + 1e-5) + np.abs(xhat.astype(np.float32)) * 2**-11 + 2**-25


def refresh_crc(blob: bytes | bytearray) -> bytes:
    """The blob with its checksum recomputed, to reach the checks behind the checksum."""
    body = bytes(blob[:-4])
    return body + struct.pack("<I", zlib.crc32(body))


def section_offsets(blob: bytes) -> dict[str, int]:
    """Byte offsets of the prelude, header and payload of a blob."""
    (hlen,) = struct.unpack_from("<I", blob, 8)
    return {"prelude": 0, "header": 12, "payload": 12 + hlen, "crc": len(blob) - 4}


def custom(name: str = "custom", **kw) -> CodecConfig:
    """A quantized config for tests, with overridable fields."""
    base = {"id": "kvdesk.kv", "name": name, "mode": "quantized", "lanes": 4, "states": 3,
            "sink_tokens": 0, "anchor_group": 0,
            "keys": {"scale": "channel", "bins": [16, 8], "layer_edges": [0.5]},
            "values": {"scale": "token", "bins": [12], "layer_edges": []}}
    base.update(kw)
    return CodecConfig.from_config(base)


def calibration_of(keys: np.ndarray, values: np.ndarray, head_dim: int = 64,
                   level: str = "high", block: int | None = None) -> Calibration:
    """A calibration fitted on this KV with one calibrated level, `level`'s bins through the
    transforms (codec.calibrated.calibration.fitted; block: the keys' basis exact over such
    blocks)."""
    return fitted(keys, values, levels()[level], level, head_dim, {"made_by": "tests"}, block)
