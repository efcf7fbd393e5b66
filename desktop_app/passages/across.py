"""The passages of several long documents a question needs: each one's retrieval, merged.

One document's retrieval (`retrieve.Retriever.retrieve`) scores its passages on a scale of
its own: reciprocal rank fusion where the question's rare words focus it (~0.03), raw BM25
where none does (~1-10). Between two documents those scores do not compare: sorted
together, the one scored raw would take every place, and a question naming a reactor that
only the second document holds would read the first's passages alone. The merge orders the
hits by
what does compare across documents: first how many of the question's words rare in all of
them together each passage holds (a name the chat's documents hold in at most
`RARE_PASSAGES` passages between them), then BM25 over the question, and over the question
with the chat's recent turns, from the one full-text index (its statistics are the whole
store's, so one query scores every document's passages alike), then its rank in its own
document. Focused, as one document's retrieval is (`most_named`): when the question writes
such rare words, only the passages holding the most of them are read. A follow-up saying
nothing of its own counts the recent turns' rare words too, unfocused: they say what it is
about. A document holding none of the question's words (those by which it asks aside) gives
nothing beside one that does, but to a follow-up: its own retrieval could offer only passages
near the question in meaning.

It never computes KV and never decides what the chat's context holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from store.documents.passages import query_words

from . import DEFAULT_K
from .retrieve import (
    CANDIDATES,
    RARE_PASSAGES,
    Hit,
    Retriever,
    asked_with,
    frequencies,
    held_together,
    most_named,
    rare_words,
    recent_text,
    written_names,
)


def across(retriever: Retriever, doc_ids: Sequence[int], question: str, *,
           recent: Sequence[str] = (), k: int = DEFAULT_K,
           focus: bool = False) -> list[tuple[int, Hit]]:
    """The `k` passages of the documents `doc_ids` that best answer `question` asked after
    the chat's `recent` turns, best first, as (document id, hit); one document's are its
    own retrieval's, in its order (see the module's docstring). A follow-up saying nothing of
    its own about what it asks (not `Retriever.specific` in any of them: "Who runs it now?")
    counts the recent turns' rare words beside its own, and is not focused on them: what "it"
    is, the turns say (as one document's retrieval reads them, `Retriever._bm25`)."""
    found = {d: retriever.retrieve(d, question, recent=recent, k=k, focus=focus)
             for d in dict.fromkeys(doc_ids)}
    if len(found) < 2:
        return [(d, h) for d, hits in found.items() for h in hits]
    store, docs, turns = retriever.store, list(found), recent_text(recent)
    holders = rare_holders(retriever, docs, question)
    follow_up = bool(turns) and not any(retriever.specific(d, question) for d in docs)
    if follow_up:
        holders = {**rare_holders(retriever, docs, "\n".join(turns)), **holders}
    bm25: dict[int, float] = {}
    for query in dict.fromkeys([question, " ".join([question, *turns])]):
        for d in docs:
            for p, score in store.search_passages(d, query, CANDIDATES):
                bm25[p.id] = bm25.get(p.id, 0.0) + score
    # A document holding none of the question's words (but those by which it asks) gives
    # only passages near it in meaning: beside one that holds them, those fill the places
    # with what the question never names. (A follow-up's turns say what it is about.)
    worded = set() if follow_up else {
        d for d in docs if any(frequencies(store, d, question, 1).values())}
    of = {h.passage_id: (d, h) for d, hits in found.items() for h in hits
          if d in worded or not worded}
    rank = {h.passage_id: i for hits in found.values() for i, h in enumerate(hits)}
    order = sorted(of, key=lambda pid: (-sum(pid in ids for ids in holders.values()),
                                        -bm25.get(pid, 0.0), rank[pid], pid))
    if focus and holders and not follow_up:
        kept = most_named([(pid, 0.0) for pid in order], holders,
                          written_names(question, holders))
        order = [pid for pid, _ in kept]
    return [of[pid] for pid in order[:k]]


def rare_holders(retriever: Retriever, doc_ids: Sequence[int],
                 text: str) -> dict[str, set[int]]:
    """{word of `text` that at most RARE_PASSAGES passages of the documents `doc_ids` hold
    together: the ids of those passages}, as one document's retrieval picks its rare words
    (`rare_words`, the words by which a question asks left out): none when every word of
    it is so rare (they say no more than the question), and, when it writes a name they hold
    more often, only its names and the words a passage holds with it."""
    store = retriever.store
    asking = asked_with(text)
    holding = {word: [pid for d in doc_ids
                      for pid in store.passages_holding(d, word, RARE_PASSAGES + 1)]
               for word in query_words(text) if word not in asking}
    counts = {word: len(ids) for word, ids in holding.items()}
    rare = rare_words(counts, text, lambda word, often: held_together(
        store, doc_ids, word, often))[0]
    return {} if len(rare) == len(counts) else {word: set(holding[word]) for word in rare}
