"""Chunk lists: a KV cut into consecutive chunk blobs, and such blobs joined back into one KV.

Built on `pipeline`'s one-blob encode and decode; it adds only the cutting, the check that the
blobs are consecutive chunks of one KV, and the join. Like the pipeline, it holds no
per-element loops.
"""

from __future__ import annotations

import numpy as np

from .calibrated.calibration import Calibration
from .errors import CodecError
from .format import container
from .format.levels import CodecConfig
from .pipeline import Resolver, check_input, decode, encode, peek


def encode_chunks(keys: np.ndarray, values: np.ndarray,
                  level: str | CodecConfig | dict = "balanced", *, chunk_tokens: int = 256,
                  first_token: int = 0, backend=None, calibration: Calibration | None = None,
                  part: int = 0) -> list[bytes]:
    """Split the tokens into chunks of chunk_tokens (the last may be shorter) and encode each."""
    check_input(keys, values)
    if not (isinstance(chunk_tokens, int) and chunk_tokens >= 1):
        raise CodecError(f"chunk_tokens must be a positive int, not {chunk_tokens!r}")
    return [encode(keys[:, i:i + chunk_tokens], values[:, i:i + chunk_tokens], level,
                   first_token=first_token + i, backend=backend, calibration=calibration,
                   part=part)
            for i in range(0, keys.shape[1], chunk_tokens)]


def decode_chunks(blobs: list[bytes], *, backend=None,
                  calibrations: Resolver | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Decode consecutive chunk blobs and join them along the token axis."""
    if not blobs:
        raise CodecError("no chunk blobs to decode")
    infos = [peek(b) for b in blobs]
    for prev, cur in zip(infos, infos[1:], strict=False):
        if cur.first_token != prev.first_token + prev.n_tokens or (
                cur.n_layer, cur.channels) != (prev.n_layer, prev.channels):
            raise CodecError("chunk blobs are not consecutive chunks of one KV")
    shape = (infos[0].n_layer, sum(i.n_tokens for i in infos), infos[0].channels)
    if shape[0] * shape[1] * shape[2] > container.MAX_ELEMENTS:
        raise CodecError(f"chunk blobs describe an implausibly large KV {shape}")
    keys, values = np.empty(shape, np.float16), np.empty(shape, np.float16)
    at = 0
    for blob, info in zip(blobs, infos, strict=True):
        span = slice(at, at + info.n_tokens)
        decode(blob, out=(keys[:, span], values[:, span]), backend=backend,
               calibrations=calibrations)
        at += info.n_tokens
    return keys, values
