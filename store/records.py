"""The plain, immutable records the store returns: models, documents, chats, messages, KV entries.

Records are snapshots of rows; they hold no connection and never write back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Model:
    fingerprint: str
    path: str
    layout: dict[str, Any]
    created: float


@dataclass(frozen=True)
class Document:
    id: int
    content_hash: str
    title: str
    source_path: str | None
    type: str
    text: str
    n_tokens: int | None
    created: float
    # While its first attach is under way or was killed (store.schema m007): who attached it.
    attach_pid: int | None = None
    attach_host: str | None = None


@dataclass(frozen=True)
class Chat:
    id: int
    title: str
    created: float
    updated: float


@dataclass(frozen=True)
class Message:
    id: int
    chat_id: int
    role: str
    text: str
    stats: dict[str, Any] | None
    created: float
    updated: float


@dataclass(frozen=True)
class Entry:
    """A stored KV entry: the cache of tokens [token_start, token_end), extending `parent_id`."""

    id: int
    model: str
    token_start: int
    token_end: int
    parent_id: int | None
    chunk_size: int
    levels: tuple[str, ...]
    nbytes: int
    document_id: int | None
    chat_id: int | None
    last_used: float
    created: float
    prefix_hash: bytes  # store.tokens.prefix_hashes of tokens[0:token_end]: the entry's name
    calibration: str | None = None  # id of the codec calibration its chunks need
    passage: bool = False  # the KV of a long document's passage, not of a prefix it starts
    passage_hash: str | None = None  # a passage's: its text's content_hash, once known

    @property
    def n_chunks(self) -> int:
        return -(-(self.token_end - self.token_start) // self.chunk_size)


@dataclass(frozen=True)
class Span:
    """One chunk of an entry: read it with Store.read_chunk(entry_id, chunk_index, level)."""

    entry_id: int
    chunk_index: int
    token_start: int
    token_end: int


@dataclass(frozen=True)
class PrefixMatch:
    """The stored chain covering the longest prefix of a token sequence.

    `entries` runs from the root (a document's entry) to the deepest entry used; the last one may
    be covered only in part (its first few chunks). `spans` lists, in token order, exactly the
    chunks covering tokens [0, n_tokens); `tail`, when set, is the chunk after them that
    continues the query for a while (found only when lookups ask for it).
    """

    entries: tuple[Entry, ...]
    spans: tuple[Span, ...]
    n_tokens: int
    # The stored chunk after the match whose first `tail_tokens` tokens continue it (a chunk
    # is read whole, then the context is cut back: KV of a token depends only on those before).
    tail: Span | None = None
    tail_tokens: tuple[int, ...] = ()  # all of that chunk's stored tokens
    tail_match: int = 0  # how many of them equal the query's

    @property
    def parent(self) -> Entry | None:
        """The deepest entry covered in full: what a new entry for the remaining tokens extends."""
        for entry in reversed(self.entries):
            if entry.token_end <= self.n_tokens:
                return entry
        return None


@dataclass(frozen=True)
class CalibrationRecord:
    """A stored codec calibration (its bytes: Store.calibration(id))."""

    id: str
    model: str
    nbytes: int
    meta: dict
    created: float
