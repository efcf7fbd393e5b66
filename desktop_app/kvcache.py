"""KV persistence: a context's KV cache captured, encoded at every level and stored.

`KVCache.store(runtime, tokens, ...)` stores the KV of the context's first `tokens` as an entry
extending the longest prefix of them already stored (a chat's entry extends its document's,
whose chunks are never copied): encoding runs on the calling thread while the store's
background writer makes each chunk durable, and a cancel or failure leaves nothing of the
entry behind. `store_chat` stores a chat's KV after a turn, storing its first document's
entry first when it is missing, so the next chat about the document starts from it too.

It decides nothing about when to store, and it never restores: that is `streaming`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import codec
from store import BackgroundWriter, Store

from .errors import Cancelled
from .kvstate import in_position_order
from .results import Progress
from .runtime import Runtime


class KVCache:
    def __init__(self, store: Store, levels: Sequence[str], chunk_tokens: int):
        self.store = store
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
    ) -> int:
        """Encode and store the KV of `tokens` (the context's first tokens) beyond what is
        already stored for them; returns the id of the entry that ends at len(tokens)."""
        levels = tuple(levels or self.levels)
        match = self.store.longest_prefix(rt.fingerprint, tokens, touch=False)
        if match.n_tokens == len(tokens) and match.entries:
            return match.entries[-1].id
        parent = match.parent
        kv = in_position_order(rt.capture())
        if kv.n_tokens < len(tokens):
            raise Cancelled("the context no longer holds the tokens to store")
        writer = self.store.write_entry(
            rt.fingerprint, tokens, levels=levels, parent_id=parent.id if parent else None,
            chunk_size=self.chunk_tokens, document_id=document_id, chat_id=chat_id)
        with writer:
            chunks = BackgroundWriter(writer, maxsize=2 * len(levels))
            try:
                for n, span in enumerate(writer.spans):
                    if cancel is not None and cancel.is_set():
                        raise Cancelled("stopped while encoding")
                    k = kv.keys[:, span.token_start : span.token_end]
                    v = kv.values[:, span.token_start : span.token_end]
                    for level in levels:
                        chunks.put(span.chunk_index, level,
                                   codec.encode(k, v, level, first_token=span.token_start))
                    if progress:
                        progress(Progress("encode", n + 1, len(writer.spans), title))
            finally:
                chunks.close(raise_failure=False)
            chunks.close()  # raises the writer's failure, if any: the entry is aborted
        return writer.entry_id

    def store_chat(self, rt: Runtime, chat_id: int, tokens: Sequence[int],
                   first_document: tuple[int, Sequence[int]] | None) -> None:
        """Store a chat's KV after a turn or a recompute, as an extension of its first
        document's entry: (document id, its prefix tokens), stored first if it is not
        (evicted, or made under another model)."""
        if first_document is not None:
            doc_id, prefix = first_document
            if self.store.document_entry(doc_id, rt.fingerprint) is None:
                self.store_prefix(rt, prefix, document_id=doc_id)
        self.store_prefix(rt, tokens, chat_id=chat_id)
