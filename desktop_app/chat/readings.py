"""Which documents of a chat are read whole and which from their passages.

A chat is over passages when one of its documents is kept as passages and is longer than the
context holds (attached so), or when its documents do not fit the context together. Then
its documents that fit half the room together are read whole (a page of notes beside a
book), in the chat's order, and the others from their passages. A document attached whole
that such a chat cannot read whole — under a smaller context than at its attach, or beside
the chat's other documents — is kept as passages too the first time a question needs it
(`split_where_needed`), instead of being read cut short; a chat that holds it whole (under
its own context, alone or with documents it fits beside) still reads it whole, from its own
cache.

It never retrieves, restores or computes KV; `longdoc` asks it what to lay out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from store import Document, Store

from ..kv.passagekv import PassageKV
from ..model.prompts import Prompter, passage_layout
from ..model.runtime import Runtime

Wholes = list[tuple[int, str]]  # (document id, its part's text) of each document read whole


class Readings:
    def __init__(self, store: Store, prompter: Prompter, kv: PassageKV,
                 runtime: Callable[[], Runtime], splitter: Callable[[Runtime, Document], int],
                 *, enabled: bool = True):
        self.store = store
        self.prompter = prompter
        self.kv = kv
        self._runtime = runtime  # a loaded context: its size decides what fits
        self._splitter = splitter  # keeps a document attached whole as passages too
        self.enabled = enabled  # False: no retrieval, every chat reads its documents whole

    def parts(self, docs: Sequence[Document], rt: Runtime | None = None
              ) -> tuple[list[int], Wholes]:
        """(the documents read from their passages, those read whole) of a chat over
        passages; nothing for another chat."""
        if not self.enabled or not docs:
            return [], []
        counts = self.store.passage_counts()
        if not any(counts.get(d.id) for d in docs):
            return [], []
        wholes = self._plan(rt or self._runtime(), docs, counts)
        if wholes is None:
            return [], []
        held = {d for d, _ in wholes}
        return [d.id for d in docs if counts.get(d.id) and d.id not in held], wholes

    def split_where_needed(self, rt: Runtime, docs: Sequence[Document]) -> list[str]:
        """Keep as passages each document of a chat over `docs` that it cannot read whole and
        that has none yet; notes for the user."""
        return [self._note(rt, d, docs, f"kept as {self._splitter(rt, d)} passages too")
                for d in self.unsplit(rt, docs)]

    def pending(self, rt: Runtime, docs: Sequence[Document]) -> list[str]:
        """What a new chat over `docs` will say of the documents its first question keeps as
        passages (`split_where_needed`), said before it is asked."""
        return [self._note(rt, d, docs, "it will be kept as passages too")
                for d in self.unsplit(rt, docs)]

    def unsplit(self, rt: Runtime, docs: Sequence[Document]) -> list[Document]:
        """The documents of a chat over `docs` that its next question keeps as passages."""
        if not self.enabled or not docs:
            return []
        counts = self.store.passage_counts()
        if (wholes := self._plan(rt, docs, counts)) is None:
            return []
        held = {d for d, _ in wholes}
        return [d for d in docs if d.id not in held and not counts.get(d.id)]

    @staticmethod
    def _note(rt: Runtime, doc: Document, docs: Sequence[Document], what: str) -> str:
        beside = "beside its other documents and" if len(docs) > 1 else "beside"
        return (f"{doc.title}: longer than this chat's context of {rt.n_ctx:,} holds {beside} "
                f"its questions and answers: {what}, and each question in this chat is "
                "answered from the passages retrieved for it")

    def _plan(self, rt: Runtime, docs: Sequence[Document], counts: dict[int, int]
              ) -> Wholes | None:
        """The documents a chat over `docs` reads whole if it is a chat over passages (None:
        it is not one)."""
        long = self._long(rt, docs, counts)
        if not long and not self.prompter.layout(rt, docs).shortened:
            return None
        return self._wholes(rt, [d for d in docs if d.id not in long])

    def _long(self, rt: Runtime, docs: Sequence[Document], counts: dict[int, int]) -> set[int]:
        """Of `docs`, those kept as passages that this context never reads whole: all but the
        ones attached whole under this model (kept as passages for a chat that could not
        hold them) that fit its room."""
        room, attached = self.prompter.room(rt), self.store.document_tokens(rt.fingerprint)
        return {d.id for d in docs if counts.get(d.id)
                and not (attached.get(d.id, (0, 0))[1] > 0 and attached[d.id][0] <= room)}

    def _wholes(self, rt: Runtime, docs: Sequence[Document]) -> Wholes:
        """Of `docs`, in order, those that fit half the room together, as the parts read
        whole before the passages."""
        room = self.prompter.room(rt) // 2
        overhead = len(passage_layout(rt, []).tokens)
        out, used = [], 0
        for d in docs:
            text = f"Document: {d.title}\n\n{d.text}"
            cost = len(self.kv.tokens(rt, text)) - overhead
            if used + cost <= room:
                out.append((d.id, text))
                used += cost
        return out
