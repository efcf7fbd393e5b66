"""Token sequences as the store keys them: fixed-width bytes, chunk spans and prefix hashes.

A stored entry covers tokens [token_start, token_end) and is cut into chunks of chunk_size tokens
from its own start (the last may be shorter). At every chunk end p the store records the hash of
tokens[0:p] keyed by the model fingerprint; the longest-prefix lookup hashes a query once, in one
pass, at the candidate positions only. Pure functions: no I/O, no SQLite.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Iterable, Sequence

HASH_BYTES = 16


def encode(tokens: Iterable[int]) -> bytes:
    """Tokens as little-endian uint32 bytes (vocabularies fit in 32 bits; negative ids raise)."""
    packed = array("I", tokens)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def decode(data: bytes) -> list[int]:
    packed = array("I", data)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tolist()


def chunk_spans(token_start: int, token_end: int, chunk_size: int) -> list[tuple[int, int]]:
    """The (start, end) token range of each chunk of an entry covering [token_start, token_end)."""
    return [
        (start, min(start + chunk_size, token_end))
        for start in range(token_start, token_end, chunk_size)
    ]


def prefix_hashes(fingerprint: str, encoded: bytes, positions: Sequence[int]) -> list[bytes]:
    """hash(fingerprint, tokens[0:p]) for each p in ascending `positions`, in one pass."""
    hasher = hashlib.blake2b(fingerprint.encode(), digest_size=HASH_BYTES)
    # The fingerprint is a key-like prefix; the separator keeps "ab"+tokens apart from "a"+"b"...
    hasher.update(b"\0")
    view = memoryview(encoded)
    hashes = []
    done = 0
    for position in positions:
        hasher.update(view[done * 4 : position * 4])
        done = position
        hashes.append(hasher.copy().digest())
    return hashes
