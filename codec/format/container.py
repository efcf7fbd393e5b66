"""The blob layout: prelude, JSON header, payload sections, checksum.

    magic b"KVDC" | u16 format version (1, or 2 when the config names a calibration) |
    u16 flags (PACKED_IDS, or 0) | u32 header length
    header: UTF-8 JSON {config, dtype, n_layer, n_tokens, channels, first_token}, space-padded
            so the payload starts 8-byte aligned
    payload: the sections the pipeline lists, little-endian, u32 sections before u16 ones so
             every section is naturally aligned
    u32 CRC-32 of everything before it

This module validates the prelude, checksum and header fields and hands out payload sections
with bounds checks; it knows nothing of what the sections mean. It must never unpickle,
eval, or allocate from an unvalidated size.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import CodecError
from .levels import CodecConfig

MAGIC = b"KVDC"
# 1: self-contained blobs; 2: a config that names the model calibration it needs (written
# only then: blobs of uncalibrated levels stay version 1)
FORMAT_VERSION = 2
READS = (1, 2)
# A quantized blob's codebook ids travel deflated (the pipeline's payload layout says how).
# Blobs written before the flag existed carry 0 and raw ids; both decode.
PACKED_IDS = 1
KNOWN_FLAGS = PACKED_IDS
PRELUDE = struct.Struct("<4sHHI")
CRC = struct.Struct("<I")
MAX_HEADER = 1 << 16
MAX_LAYERS, MAX_CHANNELS, MAX_TOKENS = 4096, 1 << 16, 1 << 20
MAX_ELEMENTS = 1 << 31
DTYPE = "float16"  # of the decoded keys and values; the only one so far


@dataclass(frozen=True)
class Header:
    config: CodecConfig
    n_layer: int
    n_tokens: int
    channels: int
    first_token: int
    version: int = 1
    flags: int = 0


def pack(header: Header, sections: list[np.ndarray]) -> bytes:
    meta = {"config": header.config.get_config(), "dtype": DTYPE, "n_layer": header.n_layer,
            "n_tokens": header.n_tokens, "channels": header.channels,
            "first_token": header.first_token}
    text = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-(len(text) + PRELUDE.size) % 8)
    version = 1 if header.config.calibration is None else 2
    parts = [PRELUDE.pack(MAGIC, version, header.flags, len(text)) + text]
    parts += [np.ascontiguousarray(s).view(np.uint8).ravel() for s in sections]
    crc = 0
    for part in parts:  # the checksum as the parts go, so that the blob is copied only once
        crc = zlib.crc32(part, crc)
    return b"".join([*parts, CRC.pack(crc)])


def _prelude(blob: bytes) -> tuple[int, int, int, int]:
    """(header length, payload offset, version, flags) after checking magic, version, flags
    and sizes."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise CodecError(f"a codec blob must be bytes, not {type(blob).__name__}")
    if len(blob) < PRELUDE.size + CRC.size:
        raise CodecError("not a kvdesk codec blob (too short)")
    magic, version, flags, hlen = PRELUDE.unpack_from(blob, 0)
    if magic != MAGIC:
        raise CodecError("not a kvdesk codec blob (bad magic)")
    if version not in READS or flags & ~KNOWN_FLAGS:
        raise CodecError(f"unsupported codec blob format version {version} (flags {flags}); "
                         f"this build reads versions {', '.join(map(str, READS))}")
    if hlen > MAX_HEADER or PRELUDE.size + hlen + CRC.size > len(blob):
        raise CodecError("codec blob is truncated (header)")
    return hlen, PRELUDE.size + hlen, version, flags


def _header(blob: bytes, hlen: int, version: int, flags: int) -> Header:
    try:
        meta = json.loads(bytes(blob[PRELUDE.size:PRELUDE.size + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CodecError("codec blob header is not valid JSON") from err
    fields = {"config", "dtype", "n_layer", "n_tokens", "channels", "first_token"}
    if not isinstance(meta, dict) or set(meta) != fields:
        raise CodecError("codec blob header has unexpected fields")
    if meta["dtype"] != DTYPE:
        raise CodecError(f"codec blob holds {meta['dtype']!r} KV; this build decodes {DTYPE}")
    limits = {"n_layer": (1, MAX_LAYERS), "n_tokens": (1, MAX_TOKENS),
              "channels": (1, MAX_CHANNELS), "first_token": (0, 1 << 48)}
    for name, (lo, hi) in limits.items():
        v = meta[name]
        if not (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi):
            raise CodecError(f"codec blob header field {name}={v!r} is out of range")
    if meta["n_layer"] * meta["n_tokens"] * meta["channels"] > MAX_ELEMENTS:
        raise CodecError("codec blob header describes an implausibly large KV")
    config = CodecConfig.from_config(meta["config"])
    if (config.calibration is not None) != (version == 2):
        raise CodecError(f"codec blob of format version {version} "
                         f"{'lacks' if version == 2 else 'names'} a calibration")
    return Header(config, meta["n_layer"], meta["n_tokens"], meta["channels"],
                  meta["first_token"], version, flags)


def peek(blob: bytes) -> Header:
    """The header alone, without verifying the checksum or touching the payload."""
    hlen, _, version, flags = _prelude(blob)
    return _header(blob, hlen, version, flags)


def unpack(blob: bytes) -> tuple[Header, Reader]:
    """Verify the whole blob and return its header and a reader over the payload."""
    hlen, start, version, flags = _prelude(blob)
    end = len(blob) - CRC.size
    (stored,) = CRC.unpack_from(blob, end)
    if zlib.crc32(memoryview(blob)[:end]) != stored:
        raise CodecError("codec blob checksum mismatch: the blob is corrupt or truncated")
    header = _header(blob, hlen, version, flags)
    return header, Reader(np.frombuffer(blob, np.uint8, end - start, start))


class Reader:
    """Sequential, bounds-checked views of the payload."""

    def __init__(self, payload: np.ndarray) -> None:
        self._buf, self._at = payload, 0

    def take(self, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        n = math.prod(shape) * np.dtype(dtype).itemsize
        if self._at + n > self._buf.size:
            raise CodecError("codec blob is truncated (payload)")
        arr = self._buf[self._at:self._at + n].view(dtype).reshape(shape)
        self._at += n
        return arr if arr.flags.aligned else arr.copy()

    def finish(self) -> None:
        if self._at != self._buf.size:
            raise CodecError("codec blob has unexpected trailing payload bytes")
