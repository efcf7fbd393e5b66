"""A long document's passages made, embedded and stored: what attach does instead of a prefill.

Splitting and embedding a 1 MB text takes seconds (no model evaluation), so a document far
longer than the context is ready for questions right after attach. The vectors are made by
the engine's embedder and stored under its name; a document indexed by another embedder (an
older kvdesk) gets its vectors made again on first use, never compared across models.

It never computes KV and never decides what the chat context holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from store import Store

from .embed import Embedder
from .split import TARGET_TOKENS, CountFn, file_lines, split


def embedding_text(heading: Sequence[str], text: str) -> str:
    """What a passage is embedded as: its headings say what it is about as much as its text."""
    return " > ".join(heading) + "\n" + text if heading else text


class PassageIndex:
    def __init__(self, store: Store, embedder: Embedder, *, target: int = TARGET_TOKENS):
        self.store = store
        self.embedder = embedder
        self.target = target  # a passage's size in tokens (`split`; benchmarks compare sizes)

    def add(self, doc_id: int, text: str, kind: str, count_tokens: CountFn, *,
            pages: Sequence[tuple[int, int]] | None = None,
            line_numbers: Sequence[int] | None = None,
            headings: Sequence[tuple[int, int, int, str]] | None = None) -> int:
        """Split a document, embed and store its passages (replacing any); how many.
        `pages`, `line_numbers` and `headings` as `split` takes them."""
        passages = split(text, kind, count_tokens, pages=pages, line_numbers=line_numbers,
                         headings=headings, target=self.target)
        vectors = self.embedder.embed([embedding_text(p.heading, p.text) for p in passages])
        self.store.add_passages(doc_id, passages, vectors=vectors, embedder=self.embedder.name)
        return len(passages)

    def renumber(self, doc_id: int, text: str, line_numbers: Sequence[int]) -> None:
        """Number a document's stored passages by its file's lines (`split`), where a kvdesk
        that collapsed its blank runs numbered them by its text's."""
        passages = self.store.passages(doc_id)
        lines = file_lines(text, line_numbers, [(p.start, p.end) for p in passages])
        self.store.set_passage_lines([(p.id, new) for p, new in zip(passages, lines,
                                                                     strict=True)
                                      if tuple(p.lines) != new])

    def vectors(self, doc_id: int) -> tuple[list[int], np.ndarray]:
        """(passage ids in order, their vectors) under this embedder, made now if missing."""
        ids, matrix = self.store.passage_vectors(doc_id, self.embedder.name)
        if matrix is None and ids:
            passages = self.store.passages(doc_id)
            matrix = self.embedder.embed([embedding_text(p.heading, p.text) for p in passages])
            self.store.set_passage_vectors([p.id for p in passages], self.embedder.name, matrix)
            ids = [p.id for p in passages]
        if matrix is None:
            matrix = np.zeros((0, self.embedder.dimension), dtype=np.float32)
        return ids, matrix
