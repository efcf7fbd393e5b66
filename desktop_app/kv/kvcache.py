"""KV persistence: a context's KV cache captured, encoded at every level and stored.

`KVCache.store_prefix(runtime, tokens, ...)` stores the KV of the context's first `tokens` as
an entry extending the longest prefix of them already stored (a chat's entry extends its
document's, whose chunks are never copied): encoding runs on the calling thread while the
store's background writer makes each chunk durable, and a cancel or failure leaves nothing of
the entry behind. `store_chat` stores a chat's KV after a turn, storing its first document's
entry first when it is missing, so the next chat about the document starts from it too, and
drops the chat's earlier entries that no turn can resume from any more (`drop_superseded`).
Whole chunks that a restore read back at a lossy level are never stored again
(`decoded_until`): an entry holding them would pass them for computed at every level,
compact's error labelled `high`. A prompt of the local API's (or a chat's turn) that leaves a
stored entry partway, as requests sharing a long system prompt each with its own question do,
splits that entry where they part (`Store.split_entry`: its chunks moved, bytes unchanged),
and extends the part they share. Less than a chunk read past the last whole entry (a stored
chunk that goes on past the prompt, read and cut back) is stored with the new entry's own
tokens: its error stays within that chunk's.

A sliding-window (iSWA) model's entry is two things. Its chunks: the full-attention layers' KV
of its own tokens, [full layers, 256 tokens, channels], as for any model — a chat's entry shares
its document's. And its window: the sliding-window layers' KV of the positions the entry's last
token attends to (Gemma 3: the last 512), [window layers, tokens, channels], stored as window
parts of 256 at the entry's levels (store.caches.kv), because those layers' KV of a position depends
on all that came before and only a state that ends exactly at the entry's end holds it. So a
chat's entry carries its own window while reusing its document's chunks, and a restore can end
only where some entry ends (`streaming`). The window is taken from the context when it ends
exactly at the entry's end; when it does not (a document's entry stored from a chat's longer
context), nothing is stored for that entry: without its window it could never end a restore.

Chunks are encoded with the model's codec calibration when it has one (`calibrations`): its
levels are then the model's calibrated ones, and the entry names the calibration they need;
else with the model-independent levels.

A root entry can also take another level in place (`add_level`: the passages' shared head,
a few dozen tokens, when `passage_level` changes), encoded again from the context at all its
levels under the current calibration; it evicts nothing for those few bytes.

It decides nothing about when to store, and it never restores: that is `streaming`'s.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Sequence

import numpy as np

import codec
from store import (
    BackgroundWriter,
    DataDirGoneError,
    DiskFullError,
    Entry,
    NotFoundError,
    Store,
    StoreError,
    text_hash,
)

from ..calibration.calibrations import Calibrations
from ..errors import Cancelled, RuntimeStateError
from ..model.kvstate import in_position_order
from ..model.runtime import Runtime
from ..results import Progress
from .evictions import eviction_notes
from .levels import stored_by_default

log = logging.getLogger(__name__)


class KVCache:
    def __init__(self, store: Store, levels: Sequence[str], chunk_tokens: int,
                 calibrations: Calibrations):
        self.store = store
        self.calibrations = calibrations
        self.levels = tuple(levels)  # stored by default, best quality first
        self.chunk_tokens = chunk_tokens

    def store_prefix(
        self,
        rt: Runtime,
        tokens: Sequence[int],
        levels: Sequence[str] | None = None,
        *,
        document_id: int | None = None,
        chat_id: int | None = None,
        progress: Callable[[Progress], None] | None = None,
        cancel: threading.Event | None = None,
        title: str = "",
        passage: str | None = None,
        evict: bool = True,
        evicted: list[dict] | None = None,
        decoded_until: int = 0,
        holds: Sequence[int] = (),
        keep: Collection[int] = (),
        extends: int | None = None,
    ) -> int | None:
        """Encode and store the KV of `tokens` (the context's first tokens) beyond what is
        already stored for them; returns the id of the entry that ends at len(tokens), or
        None when a sliding-window model's context does not end there (no window to store)
        or when the context's first `decoded_until` tokens, read back at a lossy level, reach
        a chunk or more past the entry it would extend (stored again as if computed).
        Not to `evict` other KV, one that does not fit the storage budget is not kept
        (store.BudgetFullError); else the caches it evicted are added to `evicted`, never
        the entries `keep` (one that fits only without them is not kept: "too_large").
        `passage`: the text of the passage of `document_id` the tokens are (`passagekv`), not
        its prefix; its entry is a root, or extends entry `extends` (the passages' shared
        head, `passagekv`) where that is the longest stored prefix of `tokens`. `holds`: the
        documents whose KV the tokens hold, read before the tokens were: the entry goes with
        any of them, and is not stored if one is gone already (store.NotFoundError)."""
        levels = tuple(levels or stored_by_default(self.levels, rt, self.calibrations))
        match = self.store.longest_prefix(rt.fingerprint, tokens, touch=False)
        if match.n_tokens == len(tokens) and match.entries:
            return match.entries[-1].id
        # A passage's entry never extends another's: `blending` moves it into place alone.
        parent = match.parent if passage is None or (
            match.parent is not None and match.parent.id == extends) else None
        deepest = match.entries[-1] if match.entries else None
        if passage is None and deepest is not None and deepest is not parent and \
                deepest.document_id is None and not rt.layout.swa_layers:
            # Left partway (a shared system prompt, each request with its own question):
            # what they share becomes an entry of its own, its chunks moved, not encoded
            # again from a context that read them back.
            with contextlib.suppress(StoreError, ValueError):
                parent = self.store.split_entry(deepest.id, match.n_tokens)
        if decoded_until - (parent.token_end if parent else 0) >= self.chunk_tokens:
            return None
        return self._write(rt, tokens, levels, parent.id if parent else None,
                           document_id=document_id, chat_id=chat_id, progress=progress,
                           cancel=cancel, title=title, passage=passage, evict=evict,
                           evicted=evicted, holds=holds, keep=keep)

    def _write(self, rt: Runtime, tokens: Sequence[int], levels: tuple[str, ...],
               parent_id: int | None, *, document_id: int | None = None,
               chat_id: int | None = None, progress: Callable[[Progress], None] | None = None,
               cancel: threading.Event | None = None, title: str = "",
               passage: str | None = None, evict: bool = True,
               evicted: list[dict] | None = None, holds: Sequence[int] = (),
               keep: Collection[int] = ()) -> int | None:
        """`store_prefix`'s entry for `tokens` beyond entry `parent_id`'s: encoded, written."""
        seq = rt.capture()
        kv = in_position_order(seq.sections[0])
        if kv.n_tokens < len(tokens):
            raise Cancelled("the context no longer holds the tokens to store")
        window = None
        if rt.layout.swa_layers:
            if rt.n_tokens != len(tokens):
                return None
            window = in_position_order(seq.sections[1])
            expected = np.arange(rt.layout.window_start(len(tokens)), len(tokens))
            if not np.array_equal(window.positions, expected):
                raise RuntimeStateError(f"the sliding-window section holds positions "
                                        f"{window.positions[:1]}..{window.positions[-1:]}, "
                                        f"not the window of {len(tokens)} tokens")
        cal = self.calibrations.current(rt.fingerprint)
        writer = self.store.write_entry(
            rt.fingerprint, tokens, levels=levels, parent_id=parent_id,
            chunk_size=self.chunk_tokens, document_id=document_id, chat_id=chat_id,
            window_start=None if window is None else int(window.positions[0]),
            calibration=None if cal is None else cal.id, passage=passage is not None,
            passage_hash=None if passage is None else text_hash(passage), evict=evict,
            holds=holds, keep=keep)
        # Each chunk or window part: the KV it is cut from, that KV's first position, and its
        # calibration part (the cache section it comes from).
        parts = [(span, kv, 0, 0) for span in writer.spans]
        parts += [(span, window, int(window.positions[0]), 1) for span in writer.windows]
        sizes = dict.fromkeys(levels, 0)  # each level's bytes: what would fit, if it does not
        with writer:
            chunks = BackgroundWriter(writer, maxsize=2 * len(levels))
            try:
                for n, (span, source, first, section) in enumerate(parts):
                    if cancel is not None and cancel.is_set():
                        raise Cancelled("stopped while encoding")
                    k = source.keys[:, span.token_start - first : span.token_end - first]
                    v = source.values[:, span.token_start - first : span.token_end - first]
                    for level in levels:
                        blob = codec.encode(k, v, level, first_token=span.token_start,
                                            calibration=cal, part=section)
                        sizes[level] += len(blob)
                        chunks.put(span.chunk_index, level, blob)
                    if progress:
                        progress(Progress("encode", n + 1, len(parts), title))
            finally:
                chunks.close(raise_failure=False)
            chunks.close()  # raises the writer's failure, if any: the entry is aborted
        if evicted is not None:  # (one too large: with its levels' sizes, `fitting` reads them)
            evicted += [{**c, "level_bytes": sizes} if c.get("too_large") else c
                        for c in writer.evicted]
        # Not writer.entry_id: an identical entry stored meanwhile (by another process) is
        # adopted, and this one dropped.
        return writer.entry.id

    def add_level(self, rt: Runtime, entry: Entry, level: str) -> None:
        """Root entry `entry` of a full-attention model, whose tokens the context holds
        first, encoded again from the context at its levels and `level`: one entry of those
        tokens at both, not a second one of the same tokens (which the store refuses)."""
        kv = in_position_order(rt.capture().sections[0])
        if entry.parent_id is not None or rt.layout.swa_layers or kv.n_tokens < entry.token_end:
            raise RuntimeStateError(f"entry {entry.id} cannot be encoded again from the context")
        cal = self.calibrations.current(rt.fingerprint)
        levels = (*entry.levels, level)
        chunks = {(span.chunk_index, lv): codec.encode(
            kv.keys[:, span.token_start:span.token_end],
            kv.values[:, span.token_start:span.token_end], lv, first_token=span.token_start,
            calibration=cal, part=0)
            for span in self.store.spans(entry.id) for lv in levels}
        self.store.replace_levels(entry.id, levels, chunks, None if cal is None else cal.id)

    def store_chat(self, rt: Runtime, chat_id: int, tokens: Sequence[int],
                   first_document: tuple[int, Sequence[int]] | None,
                   evicted: list[dict] | None = None, decoded_until: int = 0,
                   holds: Sequence[int] = (),
                   drop: Callable[[], bool] = lambda: True) -> bool:
        """Store a chat's KV after a turn or a recompute, as an extension of its first
        document's entry: (document id, its prefix tokens), stored first if it is not
        (evicted, or made under another model). `holds`: the chat's documents, read before its
        tokens were (`store_prefix`). Whether it is kept: the storage budget evicts
        even the entry just written when it alone is larger, and what came back lossy is not
        stored again (`store_prefix`). What it evicted: in `evicted`. `drop`, asked once the
        context is stored: whether the chat's entries it supersedes are dropped
        (`drop_superseded`). A turn, holding the chat's turn lock (`Store.chat_turn`), always
        drops; a context stored apart from a turn (the exactness pass's) may have been
        overtaken by a newer one meanwhile, and drops only if the chat still starts with it
        (a blended chat's turns store nothing: without it their copies would pile up)."""
        if first_document is not None:
            doc_id, prefix = first_document
            if self.store.document_entry(doc_id, rt.fingerprint) is None:
                self.store_prefix(rt, prefix, document_id=doc_id, evicted=evicted,
                                  decoded_until=decoded_until)
        self.store_prefix(rt, tokens, chat_id=chat_id, evicted=evicted,
                          decoded_until=decoded_until, holds=holds)
        held = self.store.longest_prefix(rt.fingerprint, tokens, touch=False)
        if held.n_tokens < len(tokens) or not held.entries:
            return False
        if drop():
            self.drop_superseded(held.entries[-1], chat_id, tokens)
        return True

    def drop_superseded(self, stored: Entry, chat_id: int, tokens: Sequence[int]) -> None:
        """Delete the entries of chat `chat_id` under `stored`'s model that no turn can resume
        from any more, now that its context `tokens` is stored (`stored`): stored before it,
        neither a prefix of `tokens` nor going on from them (a long document's chat blends
        other passages at each turn; a regenerated answer replaced its turn), and extended by
        no entry, complete or still being written (`Store.delete_unextended`). Another chat's,
        a document's or a passage's are never touched. Housekeeping: a store error is logged,
        never raised (the turn is answered and stored already)."""
        try:
            stale = []
            for e in self.store.chat_leaves(chat_id, stored.model, stored.created):
                held = self.store.tokens(e.id)
                n = min(len(held), len(tokens))
                if e.id != stored.id and held[:n] != list(tokens[:n]):
                    stale.append(e.id)
            self.store.delete_unextended(stale)
        except StoreError as e:
            log.warning("chat %s's superseded caches are not dropped: %s", chat_id, e)

    def keep_chat(self, rt: Runtime, chat_id: int, tokens: Sequence[int],
                  first_document: tuple[int, Sequence[int]] | None,
                  decoded_until: int = 0, holds: Sequence[int] = ()) -> list[str]:
        """`store_chat`, and what the user should know of it: the caches it evicted, or that
        a full disk or a document deleted meanwhile kept it from storing (the chat's messages
        are stored already)."""
        return self._kept(lambda evicted: self.store_chat(
            rt, chat_id, tokens, first_document, evicted, decoded_until, holds),
            "this turn's cache", rt.fingerprint)[1]

    def keep_prefix(self, rt: Runtime, tokens: Sequence[int], decoded_until: int = 0,
                    holds: Sequence[int] = (), cancel: threading.Event | None = None
                    ) -> tuple[bool, list[str]]:
        """`store_prefix` of a conversation not kept as a chat (the local API's), holding the
        documents `holds`: whether it is kept, and what the user should know of it, as
        `keep_chat` says."""
        stored: list[int | None] = []
        kept, said = self._kept(lambda evicted: stored.append(self.store_prefix(
            rt, tokens, evicted=evicted, decoded_until=decoded_until, holds=holds,
            cancel=cancel)), "this conversation's cache", rt.fingerprint)
        return kept and stored != [None], said

    def _kept(self, store: Callable[[list[dict]], object], what: str, fingerprint: str
              ) -> tuple[bool, list[str]]:
        evicted: list[dict] = []
        try:
            store(evicted)
        except (DiskFullError, DataDirGoneError, NotFoundError) as e:  # the answer stands
            # (the caller tells the user: the answer's notes; the log only records it)
            log.info("%s is not stored: %s", what, e)
            # (what a store before it evicted, its document's first, went all the same)
            return False, [f"{what} is not stored: {e}",
                           *self.eviction_notes(evicted, fingerprint)]
        said = self.eviction_notes(evicted, fingerprint)
        return not any(c.get("too_large") for c in evicted), said

    def eviction_notes(self, evicted: Sequence[dict], fingerprint: str | None = None, *,
                       stored: str = "this") -> list[str]:
        """What storing a cache (`stored`) says of those it evicted to keep within the storage
        budget (store.gc's `evicted_caches`; another model's than `fingerprint`'s named so):
        nothing when it evicted none."""
        return eviction_notes(self.store, evicted, fingerprint, stored=stored)
