"""Where a streaming restore reads its chunks: the local store, or the remote tier.

A source is the chain of chunks covering the longest stored prefix of the tokens asked for,
with each chunk's size at each level (what the adaptive choice plans with) and a `read` that
returns one chunk's checked bytes or raises a StoreError. `streaming.restore` runs the same
pipeline over either, `parallel` reads in flight at once.

A remote source keeps what it reads: every chunk goes into a pending local copy of the entry
(store.shared.localcopy.LocalCopy) that the engine completes after the answer, so the next
restore is local; until then the copy is invisible to every reader of the store.

This module picks nothing: the engine decides which source a restore reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from store import Entry, PrefixMatch, Span, Store
from store.shared.localcopy import LocalCopy
from store.shared.remote import RemoteTier
from store.shared.sync import read_chunk

from .levels import EXACT


class ChunkSource(Protocol):
    kind: str  # "local" or "remote": which measured bandwidth plans its reads
    parallel: int  # reads in flight at once
    spans: Sequence[Span]  # the chunks to read, in order: they cover at least n_tokens
    n_tokens: int  # how many of the tokens asked for the chunks restore
    # The tokens the chunks hold beyond n_tokens, when the last one goes on past the tokens
    # asked for (a tail): restored with them, then cut back to n_tokens.
    beyond: Sequence[int]
    # {entry end: its window's parts} for the entries the chunks cover whole that have one
    # (a sliding-window model's: streaming resumes only at such an end).
    windows: dict[int, Sequence[Span]]
    # The entries among the chunks' that are kept at one level by design (a passage's, at
    # the setting `passage_level`; one kept exact alone: a sliding-window model's until its
    # codec is calibrated, or `attach --levels lossless`): a level asked for that they lack
    # is no news to say.
    one_level: frozenset[int]
    # {entry id: its end} of the entries among the chunks' whose KV one prefill of their
    # tokens from the first computed (a document's, as attaching does): what a restore at
    # lossless reads (`exactprefix`).
    prefilled: dict[int, int]

    def sizes(self, span: Span) -> dict[str, int]:
        """{level: bytes} of the levels this chunk can be read at."""
        ...

    def read(self, span: Span, level: str) -> bytes:
        """The chunk's bytes at `level`, checksum verified; raises StoreError."""
        ...

    def damaged(self, span: Span, level: str) -> bool:
        """Whether the chunk's entry is stored at `level` but this chunk cannot be read there
        (set aside after a failed check, or missing): repair's to mend, not a level never
        stored."""
        ...


# A stored chunk that continues the tokens asked for this far is read whole and cut back:
# decoding its 256 tokens costs a few milliseconds, computing 4 tokens some 30 on 2 cores.
TAIL_MINIMUM = 4
# A stored prefix shorter than this is not read. A restore's fixed cost (the store queried, a
# chunk read and decoded, the state set: ~0.1 s) is what computing some 30-50 tokens costs on
# 2 cores, and computing them is exact; read, a short prompt took its first tokens, lossy,
# from whatever unrelated entry began the same way (the system prompt and a message header),
# and its answer changed with what else the store held.
PREFIX_MINIMUM = 32


def stored_prefix(store: Store, fingerprint: str, tokens: Sequence[int], *,
                  touch: bool = True) -> PrefixMatch:
    """The stored prefix of `tokens` a restore reads: none under PREFIX_MINIMUM tokens."""
    match = store.longest_prefix(fingerprint, tokens, tail_minimum=TAIL_MINIMUM, touch=touch)
    return match if match.n_tokens + match.tail_match >= PREFIX_MINIMUM else \
        PrefixMatch((), (), 0)


def window_ends(store: Store, match: PrefixMatch) -> dict[int, Sequence[Span]]:
    """{entry end: its window's parts} of the entries `match` covers whole that have one."""
    whole = {e.id: e.token_end for e in match.entries if e.token_end <= match.n_tokens}
    return {whole[i]: parts for i, parts in store.windows(whole).items()}


def resumes_at(store: Store, fingerprint: str, tokens: Sequence[int], windowed: bool) -> int:
    """How many of `tokens` a restore takes from this store rather than computing them: the
    stored prefix (and a chunk stored past it), or where a sliding-window model's restore
    resumes: the last end of a stored entry with its window within them (0: none)."""
    return resumption(store, fingerprint, tokens, windowed)[0]


def resumption(store: Store, fingerprint: str, tokens: Sequence[int], windowed: bool
               ) -> tuple[int, tuple[Entry, ...]]:
    """(`resumes_at`, the entries of the stored prefix that a restore reads)."""
    match = store.longest_prefix(fingerprint, tokens, touch=False, tail_minimum=1)
    if not windowed:
        return match.n_tokens + match.tail_match, tuple(match.entries)
    return max(window_ends(store, match), default=0), tuple(match.entries)


class LocalSource:
    kind = "local"
    parallel = 1  # one SSD read at a time already outruns decoding

    def __init__(self, store: Store, fingerprint: str, tokens: Sequence[int], *,
                 touch: bool = True):
        match = stored_prefix(store, fingerprint, tokens, touch=touch)
        self._index(store, match.spans + ((match.tail,) if match.tail else ()))
        self.n_tokens = match.n_tokens + match.tail_match
        self.beyond = match.tail_tokens[match.tail_match:]
        self.windows = window_ends(store, match)

    def _index(self, store: Store, spans: Sequence[Span]) -> None:
        self.spans = tuple(spans)
        self._store = store
        self._sizes: dict[tuple[int, int], dict[str, int]] = {}
        ids = {s.entry_id for s in self.spans}
        for (entry, chunk, level), n in store.chunk_sizes(ids).items():
            self._sizes.setdefault((entry, chunk), {})[level] = n
        entries = {i: store.entry(i) for i in ids}
        # (a passage's entry, and the passages' head one extends: stored at one level)
        self.one_level = frozenset(i for i, e in entries.items() if e.passage or tuple(
            e.levels) == (EXACT,)) | {e.parent_id for e in entries.values()
                                      if e.passage and e.parent_id is not None}
        self.prefilled = {i: e.token_end for i, e in entries.items() if e.document_id is not
                          None and e.chat_id is None and not e.passage}
        # (`sizes` leaves a chunk set aside out, as if it were never stored: the entry says)
        self._stored_at = {i: e.levels for i, e in entries.items()}

    def sizes(self, span: Span) -> dict[str, int]:
        return self._sizes.get((span.entry_id, span.chunk_index), {})

    def damaged(self, span: Span, level: str) -> bool:
        return level in self._stored_at.get(span.entry_id, ()) and level not in self.sizes(span)

    def read(self, span: Span, level: str) -> bytes:
        return self._store.read_chunk(span.entry_id, span.chunk_index, level)


class RemoteSource:
    kind = "remote"

    def __init__(self, tier: RemoteTier, copy: LocalCopy):
        self.tier = tier
        self.copy = copy
        self.parallel = tier.config.parallel
        self.spans = copy.spans
        self.n_tokens = copy.manifest.token_end
        self.beyond = ()
        self.windows = {self.n_tokens: copy.windows} if copy.windows else {}
        self.one_level = frozenset({s.entry_id for s in self.spans} if copy.manifest.passage
                                   or tuple(copy.levels) == (EXACT,) else ())
        # (The tier shares documents' entries: `sync`.)
        self.prefilled = {} if copy.manifest.passage else {
            s.entry_id: self.n_tokens for s in self.spans}

    def sizes(self, span: Span) -> dict[str, int]:
        chunks = self.copy.manifest.chunks
        return {level: chunks[level][span.chunk_index].nbytes for level in self.copy.levels}

    def damaged(self, span: Span, level: str) -> bool:
        return False  # the tier sets nothing aside: a damaged object fails each read

    def read(self, span: Span, level: str) -> bytes:
        data = read_chunk(self.tier, self.copy.manifest, span.chunk_index, level)
        self.copy.add(span.chunk_index, level, data)
        return data



class SpanSource(LocalSource):
    """Chosen chunks of one stored entry (a document's cached prefix read for a blend): the
    spans asked for, at their own positions."""

    def __init__(self, store: Store, spans: Sequence[Span]):
        self._index(store, spans)
        self.n_tokens = self.spans[-1].token_end if self.spans else 0
        self.beyond = ()
        self.windows = {}  # blending is for single-section caches (sessions.blendable)
