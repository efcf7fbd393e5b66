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

from store import Document, ReadOnlyError, Store

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
        self._unwritable: set[int] = set()  # documents whose split the store could not take

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
        that has none yet; notes for the user. A store that takes no writes (read only,
        damaged, full) leaves them read as before, cut to fit, said."""
        todo, counts, refused = self.unsplit(rt, docs), [], []
        try:
            for d in todo:
                counts.append(self._splitter(rt, d))
        except ReadOnlyError as e:
            left = todo[len(counts):]
            self._unwritable.update(d.id for d in left)  # (not said to come at the next one)
            refused = [f"{joined(d.title for d in left)}: not split into passages, the store "
                       f"takes no writes ({e}): read cut to fit"]
        if not (done := todo[:len(counts)]):
            return refused
        return [self._note(rt, done, docs, f"split into passages now ({joined(map(str, counts))}"
                           "), and each question in this chat reads those retrieved for it"),
                *refused]

    def pending(self, rt: Runtime, docs: Sequence[Document], until: str | None = None
                ) -> list[str]:
        """What a chat over `docs` says before its next question splits its documents
        (`split_where_needed`): before its first question is asked (`until` None), and when
        it is reopened, saying how they are read `until` then ("read cut to fit")."""
        todo = [d for d in self.unsplit(rt, docs) if d.id not in self._unwritable]
        them = "it" if len(todo) == 1 else "them"
        what = ("split into passages at this chat's first question, which reads those "
                "retrieved for it" if until is None else
                f"{until} until this chat's next question, which splits {them} into passages "
                "and reads those retrieved for it")
        return [self._note(rt, todo, docs, what)] if todo else []

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
    def _note(rt: Runtime, todo: Sequence[Document], docs: Sequence[Document], what: str) -> str:
        names = joined(d.title for d in todo)
        why = (f"longer than a context of {rt.n_ctx:,} holds beside its questions and answers"
               if len(docs) == 1 else
               f"{'does' if len(todo) == 1 else 'do'} not fit this chat's context of "
               f"{rt.n_ctx:,} beside its other documents and its questions and answers")
        return f"{names}: {why}: {what}"

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
        ones attached whole (kept as passages for a chat that could not hold them) that fit
        its room, counted under this model, else as attached."""
        room, attached = self.prompter.room(rt), self.store.document_tokens(rt.fingerprint)

        def long(d: Document) -> bool:  # (no record: attached under another model)
            tokens, kept = attached.get(d.id, (d.n_tokens, None))
            return kept == 0 or tokens is None or tokens > room
        return {d.id for d in docs if counts.get(d.id) and long(d)}

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


def joined(items) -> str:
    """"a", "a and b", "a, b and c"."""
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
