"""A chat over a document too long for the context: answered from its retrieved passages.

A document split into passages (`desktop_app.passages`) is never read whole. Each question
retrieves the passages most likely to hold its answer — the query is the question and the chat's
recent turns; at most `top_k`, and only the head of a fused ranking (`retrieve.focused`,
`retrieve.most_named`: for a question naming something rare, the passages holding the most of
its rare words) — and the chat's context becomes: its documents that fit the context, each read
whole (`wholes`; which ones: `readings`, which also keeps as passages a document attached whole
that the chat cannot read whole), then the passages, in document order, then the chat's turns,
then the question (`prompts.passage_layout`); the question's turn quotes the sentences of those
passages that name what it asks about (`evidence`: `passages.evidence`), the stored message
staying the question as asked. Each passage comes back from its own KV (`kv.passagekv`: computed
on its own the first time it is retrieved, and stored), moved into place by `blending` with its
first tokens recomputed among the passages before it; what the question's turn quotes of them is
taken from their KV too (`blending.repeats`); a context whose exact copy is stored (a turn's,
made exact in the background) is restored as it is.

How the context evolves (`choose`): the passages this question retrieves come first, best
first; for a question that is not `Retriever.specific` (one pointing back, "Does it stop at the
Museum?", or one with no rare word or name of its own, "Tell me more."), those the chat's last
question retrieved itself are kept after them, most relevant first, while the budget allows —
the context less a reserve for the answer, the chat's turns and the question — and the passages
number at most `top_k` (what one question retrieves at most); the least relevant are dropped
once they do not. A specific question reads its own passages, and no question keeps what the
questions before the last one found: the context does not grow with the chat, and a small model
is not given passages about what the chat has moved on from to answer from. When a follow-up
retrieves nothing new, the context is unchanged and the chat goes on exactly where it was
(nothing restored or computed again); when it does change, it is blended again and the turns
are computed after it. Each answer names its passages (`sources`, stored with the answer),
which is also how the chat remembers them: a reopen, in this process or another, lays out the
passages of the last answer, and the next question starts from them.

It never reads the document's whole text into the model, never stores a blended context and
never prints; the sessions call it where the chat's prefix is made.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

from store import Document, Store

from ..kv.blending import Parts
from ..kv.passagekv import PassageKV
from ..kv.sources import resumption
from ..model.prompts import Layout, Prompter, passage_layout
from ..model.runtime import Runtime
from ..passages import evidence
from ..passages.across import across
from ..passages.retrieve import DEFAULT_K, Retriever
from ..results import Progress, Source
from .library import Library
from .readings import Readings, joined

ASKED_BEFORE = 1  # a client's earlier questions whose passages a conversation keeps


class LongDocs:
    def __init__(self, store: Store, library: Library, prompter: Prompter, kv: PassageKV,
                 retriever: Retriever | None, runtime: Callable[[], Runtime],
                 splitter: Callable[[Runtime, Document], int], *, top_k: int = DEFAULT_K,
                 focus: bool = True, quote: bool = True):
        self.store = store
        # Which documents are read whole and which from passages.
        self.readings = Readings(store, prompter, kv, runtime, splitter,
                                 enabled=retriever is not None)
        self.library = library
        self.prompter = prompter
        self.kv = kv
        self.retriever = retriever
        self.top_k = top_k
        self.focus = focus  # False: always the `top_k` best (benchmarks compare the two)
        self.quote = quote  # False: the question's turn without its evidence (the same)
        self._chosen: dict[int, list[Source]] = {}  # chat id -> the passages of its latest turn
        self._offered: list[Source] = []  # a client's conversation's (`offer`)
        self._offered_wholes: list[tuple[int, str]] = []  # and its documents read whole
        self._lock = threading.Lock()

    def applies(self, docs: Sequence[Document]) -> bool:
        """Whether a chat over `docs` is answered from passages (one of them is split)."""
        return bool(self._split(docs))

    def draft_waits(self, rt: Runtime, chat_id: int | None, docs: Sequence[Document]) -> bool:
        """Whether a question typed in chat `chat_id` over `docs` is not computed ahead as a
        draft: a new chat over passages retrieves them for the question it asks, and a chat
        whose next question keeps a document as passages is laid out anew then."""
        return chat_id is None and self.applies(docs) or bool(self.readings.unsplit(rt, docs))

    def _absent(self, split: Sequence[int], wholes: Sequence[tuple[int, str]],
                question: str) -> list[str]:
        """The names `question` writes that no passage of the documents `split` holds, nor
        any document read whole (none without such documents)."""
        return evidence.unnamed(self.store, split, question, [t for _, t in wholes]) \
            if split else []

    def _split(self, docs: Sequence[Document]) -> list[int]:
        return self.readings.parts(docs)[0]

    # -- which passages ----------------------------------------------------------------------

    def choose(self, rt: Runtime, chat_id: int | None, question: str,
               docs: Sequence[Document]) -> list[str]:
        """Retrieve the passages for `question` in chat `chat_id` over `docs` and make them its
        context's (see the module's docstring); notes for the user. A chat not created yet
        (None: it is stored with its first answer) holds them as a conversation not kept as a
        chat does (`offer`), until `adopt` gives them its id."""
        split = self.readings.split_where_needed(rt, docs)
        if not self.applies(docs):
            if chat_id is None:  # a new chat's context holds no passages of an earlier one
                self.offer((), ())
            return split
        history = self.library.history(chat_id) if chat_id is not None else []
        # (Retrieval keeps the last turns of these: follow-ups say "it".)
        turns = self._turns_tokens(rt, chat_id, history) if history else 0
        # What the chat keeps is what its last stored answer's question retrieved: not the
        # passages of a question stopped or refused since, which the context may still hold.
        chosen, notes = self.pick(rt, docs, question, [m.text for m in history],
                                  turns + len(rt.tokenize(question)) + 16,  # its template's
                                  (lambda: own(self._answered(chat_id, docs))) if history
                                  else None)
        if chat_id is None:
            self.offer(chosen, self.wholes(rt, docs))
        else:
            with self._lock:
                self._chosen[chat_id] = chosen
        return split + notes

    def evidence(self, docs: Sequence[Document], wholes: Sequence[tuple[int, str]],
                 sources: Sequence[Source], question: str,
                 before: str = "") -> tuple[list[str], list[str]]:
        """What `question`'s turn says in a chat over `docs` whose context holds the
        documents read whole `wholes`, then the passages `sources` (in document order): the
        lines it quotes, the sentences of each that name what it asks about
        (`evidence.beside`, `evidence.naming`), at most `evidence.MOST`; and the names it
        writes that none of them holds (`evidence.unnamed`). Neither when quoting is off.
        A follow-up that quotes nothing and says nothing of its own about what it asks (not
        `Retriever.specific`: "For how much money?") asks about what the question `before`
        it named, as its retrieval has it: that is quoted."""
        if not self.quote:
            return [], []
        books = self._split(docs)
        found = self._naming(docs, books, wholes, sources, question)
        if not found and before and not any(self.retriever.specific(d, question)
                                            for d in books):
            found = self._naming(docs, books, wholes, sources, f"{question}\n{before}")
        return found, self._absent(books, wholes, question)

    def _naming(self, docs: Sequence[Document], books: Sequence[int],
                wholes: Sequence[tuple[int, str]], sources: Sequence[Source],
                question: str) -> list[str]:
        """The sentences `evidence` quotes for `question` (`books`: the documents split)."""
        kinds = {d.id: d.type for d in docs}
        by_doc: dict[int, list[str]] = {}
        for s in sources:
            by_doc.setdefault(s.document_id, []).append(s.text)
        # What only the documents read whole hold ("phone" in the notes, in no passage of the
        # book) comes first; then the book's own, which outrank the notes on what both hold.
        # (Of a document read whole, its own text: not the line naming it in the context.)
        own_text = {d.id: d.text for d in docs}
        besides = [evidence.beside(self.store, books, question, own_text[doc_id])
                   for doc_id, _ in wholes]
        found = [*(line for absent, _ in besides for line in absent),
                 *(line for doc_id, texts in by_doc.items()
                   for line in evidence.naming(self.store, doc_id, question, texts,
                                               kind=kinds.get(doc_id, "text"))),
                 *(line for _, rare in besides for line in rare)]
        return list(dict.fromkeys(found))[:evidence.MOST]

    def quoted(self, rt: Runtime, chat_id: int | None, docs: Sequence[Document],
               question: str) -> tuple[list[str], list[str]]:
        """The `evidence` of `question` in chat `chat_id` over `docs`: over the documents
        read whole and the passages its context holds when it is a chat over passages, else
        none."""
        if not self.applies(docs):
            return [], []
        asked = [m.text for m in (self.library.history(chat_id) if chat_id is not None else [])
                 if m.role == "user"]
        return self.evidence(docs, self.wholes(rt, docs), self.sources(chat_id), question,
                             asked[-1] if asked else "")

    def adopt(self, chat_id: int) -> None:
        """A new chat was stored as `chat_id`: the passages its first question was given are
        its own from now on."""
        with self._lock:
            self._chosen[chat_id] = list(self._offered)

    def pick(self, rt: Runtime, docs: Sequence[Document], question: str, recent: Sequence[str],
             used: int, kept: Callable[[], Sequence[Source]] | None = None
             ) -> tuple[list[Source], list[str]]:
        """The passages of `docs` for `question` asked after the `recent` turns, with `used`
        tokens of the context taken by the conversation, keeping those `kept` gives while
        room remains when the question is not `specific` (it asks about what it names: they
        are not even looked for); (passages in document order, notes)."""
        split, wholes = self.readings.parts(docs, rt)
        hits = self._hits(split, question, recent)
        kept = kept if kept and not any(self.retriever.specific(d, question)
                                        for d in split) else tuple
        overhead = len(passage_layout(rt, []).tokens)
        read_whole = sum(len(self.kv.tokens(rt, text)) - overhead for _, text in wholes)
        chosen = self._fit(rt, hits, list(kept()), self.prompter.room(rt) - used - read_whole,
                           [d.id for d in docs])
        notes = self.unread(docs, split, wholes)
        if missing := self._absent(split, wholes, question):
            names = " and ".join(missing)
            books = ", ".join(d.title for d in docs if d.id in split)
            notes.append(f"{names} {'is' if len(missing) == 1 else 'are'} named nowhere in "
                         f"{books}: the passages read are those nearest the question, and "
                         "may be about something else")
        read = {s.passage_id for s in chosen}
        if hits and not read & {s.passage_id for s in hits}:
            notes.append("no retrieved passage fits what is left of the context: "
                         "start a new chat")
        elif left_out := len({s.text for s in hits} - {s.text for s in chosen}):
            notes.append(f"{left_out} of the {len({s.text for s in hits})} passages retrieved "
                         "for this question did not fit what is left of the context (a new "
                         "chat, or a larger context in the settings, has more room)")
        return chosen, notes

    def unread(self, docs: Sequence[Document], split: Sequence[int] | None = None,
               wholes: Sequence[tuple[int, str]] | None = None, rt: Runtime | None = None
               ) -> list[str]:
        """What the user is told of the documents of a chat over passages read neither whole
        nor as passages (`split` and `wholes` as `pick` has them; else computed, with `rt`)."""
        if split is None or wholes is None:
            split, wholes = self.readings.parts(docs, rt)
        held = {d for d, _ in wholes}
        if not (left := [d.title for d in docs if d.id not in split and d.id not in held]):
            return []
        names = ", ".join(left)
        return [f"{names} not read in this chat: beside the passages of a document longer "
                "than the context, the documents read whole may take half of it (ask about "
                f"{names} in a chat of its own)"]

    def asked_before(self, docs: Sequence[Document], earlier: Sequence[dict]) -> list[Source]:
        """The passages the last ASKED_BEFORE questions among a conversation's `earlier`
        messages were given, each retrieved after the messages before it as its request was:
        what a chat keeps of its turns (`pick`'s `kept`), for a conversation a client sends
        as text (the local API's)."""
        split, given = self._split(docs), {}
        texts = [m["content"] for m in earlier]
        asks = [i for i, m in enumerate(earlier) if m["role"] == "user"][-ASKED_BEFORE:]
        for i in asks:
            for s in self._hits(split, texts[i], texts[:i]):
                given.setdefault(s.passage_id, s)
        return list(given.values())

    def _hits(self, split: Sequence[int], question: str, recent: Sequence[str]
              ) -> list[Source]:
        """The best passages of the documents `split` for `question`, best first, focused
        (passages far below the best distract a small model): `passages.across`."""
        return [Source.of(h, d) for d, h in across(self.retriever, split, question,
                                                   recent=recent, k=self.top_k,
                                                   focus=self.focus)]

    def offer(self, sources: Sequence[Source], wholes: Sequence[tuple[int, str]]) -> None:
        """The passages a conversation not kept as a chat (the local API's) is laid out with,
        after its documents read whole (`wholes`): what the next restore of a prefix starting
        with them blends."""
        with self._lock:
            self._offered, self._offered_wholes = list(sources), list(wholes)

    @property
    def offering(self) -> bool:
        """Whether a client's conversation is given passages or documents read whole now."""
        with self._lock:
            return bool(self._offered or self._offered_wholes)

    def wholes(self, rt: Runtime, docs: Sequence[Document]) -> list[tuple[int, str]]:
        """The documents of a chat over passages that are not split, each read whole before
        the passages as a part of its own ((id, the part's text), in the chat's order), while
        together they take at most half the room: a user who attaches a book and a page of
        notes asks about both. A part's KV is kept as a passage's is (computed once, keyed by
        its text)."""
        return self.readings.parts(docs, rt)[1]

    def named(self, wholes: Sequence[tuple[int, str]]) -> list[dict]:
        """The documents read whole (`wholes`) as an answer names them beside its passages:
        {"document_id", "title"} each (AskResult.read_whole)."""
        return [{"document_id": d, "title": self.library.document(d).title} for d, _ in wholes]

    def cited(self, rt: Runtime, chat_id: int | None, docs: Sequence[Document]) -> dict:
        """What an answer in chat `chat_id` over `docs` was given, as AskResult says it: the
        passages its context holds (`sources`) and the documents read whole before them
        (`read_whole`); neither in a chat not over passages."""
        if not self.applies(docs):
            return {"sources": [], "read_whole": []}
        return {"sources": [s.as_dict() for s in self.sources(chat_id)],
                "read_whole": self.named(self.wholes(rt, docs))}

    def laid_out(self, rt: Runtime, wholes: Sequence[tuple[int, str]],
                 sources: Sequence[Source]) -> Layout:
        """The prefix of a chat over passages: its documents read whole, then the passages."""
        return passage_layout(rt, [*(text for _, text in wholes), *(s.text for s in sources)])

    def _fit(self, rt: Runtime, hits: list[Source], kept: list[Source], budget: int,
             doc_order: list[int]) -> list[Source]:
        """This question's hits, best first, then the chat's earlier passages, most relevant
        first, while they fit `budget` tokens and the passages number at most `top_k`, each
        text once; in document order, the earlier ones marked so (`Source.earlier`). None of
        the earlier ones when none of this question's fits: they would answer it in its
        place."""
        fresh = {s.passage_id for s in hits}
        # (Each document's scores are on a scale of its own: `passages.across`.)
        best = {s.document_id: s.score for s in sorted(kept, key=lambda s: s.score)}
        ranked = list(hits) + sorted(
            (s for s in kept if s.passage_id not in fresh),
            key=lambda s: -s.score / best[s.document_id] if best[s.document_id] > 0 else 0.0)
        overhead = len(passage_layout(rt, []).tokens)
        used, chosen, texts = overhead, [], set()
        for s in ranked:
            if fresh and s.passage_id not in fresh and (not chosen or len(chosen) >= self.top_k):
                break  # (none, or no more than a question retrieves at most, in all)
            cost = len(self.kv.tokens(rt, s.text)) - overhead
            if used + cost <= budget and s.text not in texts:  # (a text repeated: read once)
                chosen.append(s)
                used += cost
                texts.add(s.text)
        position = {d: i for i, d in enumerate(doc_order)}
        return sorted((replace(s, earlier=s.passage_id not in fresh) for s in chosen),
                      key=lambda s: (position.get(s.document_id, 0), s.index))

    def _turns_tokens(self, rt: Runtime, chat_id: int, history) -> int:
        known = self.store.message_tokens(chat_id, rt.fingerprint)
        return sum(len(known[m.id]) if m.id in known else len(rt.tokenize(m.text)) + 8
                   for m in history)

    def sources(self, chat_id: int | None) -> list[Source]:
        """The passages chat `chat_id`'s context holds: those of its latest question, or, in
        another process, those its last answer named (a chat not created yet: those offered);
        none of a document deleted since."""
        if chat_id is None:
            with self._lock:
                return list(self._offered)
        docs = self.library.chat_documents(chat_id)
        if not self.applies(docs):
            return []
        with self._lock:
            chosen = self._chosen.get(chat_id)
        if chosen is None:
            return self._answered(chat_id, docs)
        kept = {d.id for d in docs}
        return [s for s in chosen if s.document_id in kept]

    def _answered(self, chat_id: int, docs: Sequence[Document]) -> list[Source]:
        """The passages chat `chat_id`'s last stored answer named, of `docs` still there."""
        last = next((m.stats["sources"] for m in reversed(self.library.history(chat_id))
                     if m.role == "assistant" and m.stats
                     and m.stats.get("sources") is not None), [])
        kept = {d.id for d in docs}
        return [s for s in map(Source.from_dict, last) if s.document_id in kept]

    def first_document(self, rt: Runtime, chat_id: int) -> tuple[int, Sequence[int]] | None:
        """(id, prefix) of the document whose entry a chat's extends (stored first when
        missing); None for a chat over passages, whose entry extends its first passage's."""
        docs = self.library.chat_documents(chat_id)
        if not docs or self.applies(docs):
            return None
        return docs[0].id, self.prompter.prefix(rt, docs[0]).tokens

    # -- the chat's prefix -------------------------------------------------------------------

    def layout(self, rt: Runtime, chat_id: int | None,
               docs: Sequence[Document] | None = None) -> Layout | None:
        """The prefix of a chat over passages (None: not such a chat); a chat not created yet
        (None) is over `docs`."""
        if docs is None:
            docs = self.library.chat_documents(chat_id) if chat_id is not None else ()
        split, wholes = self.readings.parts(docs, rt)
        if not split:
            return None
        sources = self.sources(chat_id)
        layout = self.laid_out(rt, wholes, sources)
        # (documents kept as passages by another chat's question, or read whole before under
        # a larger context)
        later = self.readings.pending(rt, docs, "not read") if chat_id is not None else []
        if not sources:
            later.append(f"{joined(d.title for d in docs if d.id in split)}: read from the "
                         "passages each question retrieves; none is in this chat's context now")
        return replace(layout, later=tuple(later))

    def prefix(self, rt: Runtime, chat_id: int | None,
               docs: Sequence[Document] | None = None) -> Layout:
        """A chat's prefix before its turns: its passages (`layout`), else its documents (a
        chat not created yet (None) is over `docs`), said cut until its next question keeps
        them as passages (`readings.pending`)."""
        if docs is None:
            docs = self.library.chat_documents(chat_id) if chat_id is not None else ()
        if (layout := self.layout(rt, chat_id, docs)) is not None:
            return layout
        layout = self.prompter.layout(rt, docs)
        # (said instead of the cut's own notes, whose advice its next question makes wrong)
        pending = self.readings.pending(rt, docs, "read cut to fit") if layout.shortened else []
        return replace(layout, shortened=(), later=tuple(pending)) if pending else layout

    def blendable(self, rt: Runtime, chat_id: int | None, tokens: Sequence[int],
                  cancel: threading.Event | None,
                  progress: Callable[[Progress], None] | None = None) -> Parts | None:
        """What to blend when `tokens` start with a passage chat's prefix that needs it. The
        passages with no KV yet are computed first, each on its own, and stored (`rt` is left
        to the restore that follows); None when the prefix is stored exactly, which a plain
        restore reads. One passage, or a prefix stored exactly whose passages read were
        damaged (computed again here), has no later parts: a plain restore reads it too, and
        its Parts carry only what making it ready found (`notes`)."""
        if chat_id is None:
            with self._lock:
                sources, wholes = list(self._offered), list(self._offered_wholes)
            if not sources and not wholes:
                return None
        elif self.applies(docs := self.library.chat_documents(chat_id)):
            sources, wholes = self.sources(chat_id), self.wholes(rt, docs)
        else:
            return None
        layout = self.laid_out(rt, wholes, sources)
        if tuple(tokens[:len(layout.tokens)]) != layout.tokens:
            return None
        at, read = resumption(self.store, rt.fingerprint, tokens, bool(rt.layout.swa_layers))
        # A passage (or their head) set aside that a plain restore reads fails there at every
        # question: made ready, it is computed again and stored, and the restore reads it.
        # (One indexed query over the few entries read, as the restore's own sizes are.)
        exact = at >= len(layout.tokens)
        if exact and not self.store.quarantined([e.id for e in read if e.chat_id is None]):
            return None
        ready = self.kv.ensure(rt, [*wholes, *((s.document_id, s.text) for s in sources)],
                               cancel=cancel, progress=progress)
        notes = list(ready.notes)
        computed = [layout.parts[i][1] - layout.parts[i][0] for i in ready.computed_at]
        if whole := sum(i < len(wholes) for i in ready.computed_at):
            notes.append(f"{whole} document(s) read whole beside the passages: their KV "
                         f"computed ({sum(computed[:whole]):,} tokens) and stored, as a "
                         "passage's is")
        if ready.computed - whole:
            notes.append(f"{ready.computed - whole} passage(s) with no stored KV (never "
                         "retrieved, or evicted under the storage budget): their KV computed "
                         f"({sum(computed[whole:]):,} tokens in all) and stored")
        if ready.pulled:
            notes.append(f"{ready.pulled} passage(s) taken from the shared cache")
        return Parts(layout, [] if exact else ready.entries[1:], notes, sum(computed),
                     "documents and passages" if wholes else "passages", ready.pulled > 0)


def own(sources: Sequence[Source]) -> list[Source]:
    """Of an answer's passages, those its question retrieved itself (none: all of them)."""
    return [s for s in sources if not s.earlier] or list(sources)
