"""The passages of a long document a question needs: BM25, dense, and the two fused.

BM25 comes from the store's FTS5 index, over the whole query and, fused with it, over the
query's rare words (a name or an identifier, in at most three passages: a paraphrased
question often shares only that with its answer; an identifier with an underscore counts as
written, `named`; so does a name of several capitalised words whose words are common, "Ines
Brandt" in a staff table, `name_phrases`); dense similarity from the passages'
stored vectors (a dot product with the query's, in numpy: a 3 MB text has ~7,000 passages);
`fused` is reciprocal rank fusion (Cormack et al., 2009: score = sum of weight / (60 +
rank)), the dense ranking weighed a tenth of BM25's. The query is the question and the
chat's recent turns, the question leading: BM25 over it alone fused with BM25 over both, its
rare words focusing the reading (joined by the turns' for a follow-up writing no name: "who
keeps it?"), its vector weighed twice the turns'. BM25 is the default: on haystacks of three
kinds with planted facts it finds the fact's passage first for 90 % of questions and among
the first 5 for all, where the static embeddings alone find it among the first 8 for about a
third and every fusion ranks it lower (benchmarks/bench_retrieval.py; RESULTS.md "Retrieval
in long documents"). A chat's retrieval is `focus`ed: when the question has rare words, it keeps
the passages scoring above half the best (`focused`: those that hold them) and, of those,
the ones holding the most of them (`most_named`), which a small model reads far better
than eight.

It never computes KV and never decides what the chat context holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from store import Store
from store.documents.passages import query_words

from ..errors import EngineError
from ..results import Record, in_file, location
from . import DEFAULT_K, DEFAULT_MODE, MODES
from .embed import Embedder, normalise
from .index import PassageIndex

RRF_K = 60  # the constant of reciprocal rank fusion (the paper's, and common practice)
DENSE_WEIGHT = 0.1  # the dense ranking's share in the fusion, against BM25's 1 (measured)
RARE_PASSAGES = 3  # a query word in at most this many passages is a rare one (a name)
EVERY_PASSAGE = 2**62  # a limit to `passages_holding` that never cuts its list short
# Words by which a question points back at what the chat was about: such a question is not
# about what it names alone ("Does it stop at the Museum?").
REFERS_BACK = frozenset({"it", "its", "they", "them", "their", "theirs", "this", "that",
                         "these", "those", "he", "him", "his", "she", "her", "hers"})
# Words by which a question asks ("how much", "tell me", "summarize"), not what it asks
# about: rare in a long document by chance, each would be taken for a name the question
# writes, its passages read and its sentences quoted as the answer ("For how much money?"
# answered from "the grammar was much more restrictive"). Searched for, as any word; never
# counted rare unless written as a name (`any()`, "William Tell": `asked_with`).
ASKING = frozenset(
    "about any can could describe explain give many me more much please say says should "
    "summarise summarize tell there would".split())
CANDIDATES = 50  # from each ranking, before fusing
RECENT_TURNS = 2  # the chat's last turns that join the question
RECENT_CHARS = 400  # of each of them
RECENT_WEIGHT = 0.5  # of their vector against the question's
# A focused retrieval keeps the passages scoring above this share of the best one's fused
# score: those found by every ranking, not by one of them alone (`focused`).
FOCUS_SHARE = 0.5


@dataclass(frozen=True)
class Hit(Record):
    """A retrieved passage, where it is, and how well it matched (higher is better)."""

    passage_id: int
    index: int
    text: str
    page: int | None
    lines: tuple[int, int]
    heading: tuple[str, ...]
    tokens: int
    score: float
    file: str | None = None  # a folder's passage: its file (`heading`: the headings in it)

    @property
    def location(self) -> str:
        """"page 3" for a PDF, "src/db.py, lines 120-141" in a folder, else "lines 120-141"."""
        return location(self.page, self.lines, self.file)

    def as_dict(self) -> dict:
        """Its fields; `file` only for a folder's passage (its `lines` are within that file)."""
        out = super().as_dict()
        if out["file"] is None:
            del out["file"]
        return out

    @classmethod
    def of(cls, passage, kind: str, score: float = 0.0) -> Hit:
        """A stored passage (`store.passage`) of a document of `kind`."""
        file, heading = in_file(kind, passage.heading)
        return cls(passage.id, passage.index, passage.text, passage.page, passage.lines,
                   heading, passage.tokens, round(score, 6), file)


def recent_text(turns: Sequence[str]) -> list[str]:
    """The chat's last turns as they join a query: the latest few, each cut short."""
    return [t[:RECENT_CHARS] for t in list(turns)[-RECENT_TURNS:] if t.strip()]


class Retriever:
    def __init__(self, store: Store, embedder: Embedder, mode: str = DEFAULT_MODE, *,
                 dense_weight: float = DENSE_WEIGHT, rare_words: bool = True):
        check_mode(mode)
        self.store = store
        self.embedder = embedder
        self.index = PassageIndex(store, embedder)
        self.mode = mode
        self.dense_weight = dense_weight
        self.rare_words = rare_words
        self._kinds: dict[int, str] = {}

    def retrieve(self, doc_id: int, question: str, *, recent: Sequence[str] = (),
                 k: int = DEFAULT_K, mode: str | None = None, focus: bool = False) -> list[Hit]:
        """The `k` passages of document `doc_id` that best answer `question` asked after the
        chat's `recent` turns (oldest first), best first; with `focus`, when BM25 ranks them
        fused with rare words (`_bm25`), only those scoring above half the best (`focused`):
        of those, for the question's own rare words, the ones holding the most of them
        (`most_named`); for a follow-up writing no name, whose turns' rare words join its
        own, all of them and the passage the question alone matches best."""
        mode = mode or self.mode
        check_mode(mode)
        if k < 1:
            raise EngineError(f"the number of passages to retrieve must be at least 1, not {k}")
        turns = recent_text(recent)
        ranked: list[list[tuple[int, float]]] = []
        holders: dict[str, set[int]] = {}  # the rare words BM25 was fused with: their passages
        lead: list[int] | None = None
        if mode in ("bm25", "fused"):
            bm25, holders, lead = self._bm25(doc_id, question, turns, max(k, CANDIDATES))
            ranked.append(bm25)
        # A question sharing no word with the document ("Summarize this.") still gets the
        # passages nearest to it in meaning, never none.
        if mode in ("dense", "fused") or not ranked[0]:
            ranked.append(self._dense(doc_id, question, turns, max(k, CANDIDATES)))
        order = ranked[0] if len(ranked) == 1 else fuse(ranked, [1.0, self.dense_weight])
        if focus and holders and len(ranked) == 1:
            head = focused(order)
            if lead is None:  # the question's own rare words
                order = most_named(head, holders, written_names(question, holders))
            else:  # the turns': what "it" is, not which of its passages; and beside them
                # the passage the question alone matches best (it may change the subject)
                shown = {pid for pid, _ in head}
                order = head + [(pid, s) for pid, s in order if pid in lead and pid not in shown]
        # Only the passages returned are read (a 3 MB document has ~7,000).
        kind = self.kind(doc_id) if order else ""
        return [Hit.of(self.store.passage(pid), kind, score) for pid, score in order[:k]]

    def kind(self, doc_id: int) -> str:
        """A document's kind, read once (a document's id is never reused: `store.schema`)."""
        if doc_id not in self._kinds:
            self._kinds[doc_id] = self.store.document(doc_id).type
        return self._kinds[doc_id]

    def _bm25(self, doc_id: int, question: str, turns: list[str],
              n: int) -> tuple[list[tuple[int, float]], dict[str, set[int]], list[int] | None]:
        """BM25 over the question, fused with BM25 over the question and the chat's recent
        `turns` (what a follow-up's "it" refers to), then with a ranking of the passages
        holding the question's rare words (a name, an identifier: in at most RARE_PASSAGES
        passages) when it has any; for a follow-up saying nothing of its own, with the recent
        turns' rare words too (a word of its own may be rare by chance, "Who keeps it?").
        Returns (ranking,
        {rare word: the passages holding it}, empty when not fused; None when the rare words
        are the question's own, else the passage BM25 over the question alone ranks first,
        read beside them).

        The question leads: the turns' words, as many as its own or more, would otherwise
        rank the last answer's passages above a follow-up's own, and their rare words would
        focus the reading on them (measured: RESULTS.md, "Follow-up questions"). A
        paraphrased question often shares only a name with the passage that answers it, and
        BM25 alone lets two common words repeated in a long passage outweigh it. When the
        question writes a name the document holds often (`written_names`: `nonlocal` in a
        language reference, "the Lessee" in a lease), its other rare words count only where
        a passage holds them with it (`rare_words`): a common word that happens to be rare
        in the document ("kept") is not what it asks about, and would take the place of
        that name's passages. A question writing a name the document holds or a word rare in
        it, and no word pointing back ("it", "they": `refers_back`), is not joined with the
        turns at all: it asks about that, whatever the chat said before."""
        alone = [(p.id, score) for p, score in self.store.search_passages(doc_id, question, n)]
        rare, names = self._rare(doc_id, question) if self.rare_words else ([], set())
        whole, lead = alone, None
        # A question saying what it asks about needs no turns to say what it is ("Who is the
        # harbormaster?", as `specific`): joined, the last answer's words (wrong ones too)
        # only add their passages to its own.
        own = bool(turns) and self.specific(doc_id, question)
        if turns and not own:
            joined = self.store.search_passages(doc_id, " ".join([question, *turns]), n)
            whole = fuse([alone, [(p.id, score) for p, score in joined]])
        if not self.rare_words:
            return whole, {}, None
        if turns and not own:  # a follow-up saying nothing of its own: "it" is the turns'
            theirs = self._rare(doc_id, " ".join(turns))[0]
            rare, lead = list(dict.fromkeys([*rare, *theirs])), [pid for pid, _ in alone[:1]]
        if not rare:
            return whole, {}, None
        holders = {w: set(self.store.passages_holding(doc_id, w, RARE_PASSAGES)) for w in rare}
        return fuse([whole, named(self.store.search_passages(doc_id, " ".join(rare), n),
                                  holders)]), holders, lead

    def specific(self, doc_id: int, question: str) -> bool:
        """Whether `question` says what it asks about in words of its own and points back at
        nothing: a word document `doc_id` holds in at most RARE_PASSAGES passages or a name
        it holds ("What does str.casefold do?", "Who maintains the Quillmere daemon?"), and
        no word of REFERS_BACK ("Give an example of it.", "Does it stop at the Museum?" are
        not; a word rare by chance, "keeps", comes with one: "Who keeps it?")."""
        if refers_back(question):
            return False
        counts = frequencies(self.store, doc_id, question, RARE_PASSAGES + 1)
        return any(0 < c <= RARE_PASSAGES for c in counts.values()) or any(
            counts[w] for w in written_names(question, counts))

    def _rare(self, doc_id: int, text: str) -> tuple[list[str], set[str]]:
        """The rare words of `text` (see `_bm25`), none when every word of it is rare (BM25
        over them is BM25 over it again); and the names it writes that the document holds."""
        counts = frequencies(self.store, doc_id, text, RARE_PASSAGES + 1)
        rare, names = rare_words(counts, text, lambda word, often: held_together(
            self.store, [doc_id], word, often))
        rare += rare_phrases(self.store, doc_id, text, counts)
        return [] if rare == list(counts) else rare, names

    def _dense(self, doc_id: int, question: str, turns: list[str],
               n: int) -> list[tuple[int, float]]:
        ids, matrix = self.index.vectors(doc_id)
        if not ids:
            return []
        vectors = self.embedder.embed([question, " ".join(turns)] if turns else [question])
        query = vectors[0] + RECENT_WEIGHT * vectors[1] if turns else vectors[0]
        scores = matrix @ normalise(query[None, :])[0]
        top = np.argsort(-scores, kind="stable")[:n]
        return [(ids[i], float(scores[i])) for i in top]


def frequencies(store: Store, doc_id: int, text: str, at_most: int) -> dict[str, int]:
    """{word of `text`: how many of the document's passages hold it, counted up to `at_most`}
    (`Store.passage_frequencies`), less the words by which it asks (`asked_with`): what its
    rare words and names are told from."""
    asking = asked_with(text)
    return {w: c for w, c in store.passage_frequencies(doc_id, text, at_most).items()
            if w not in asking}


def rare_words(counts: Mapping[str, int], text: str,
               together: Callable[[str, set[str]], bool] | None = None
               ) -> tuple[list[str], set[str]]:
    """From `counts` ({word of `text`: how many passages hold it, `frequencies`}): the words
    at most RARE_PASSAGES passages hold, and the names `text` writes that some passage holds.
    When it writes names held more often than that, its rare words are its rare names and
    those a passage holds with every one of the names held often (`together(word, names)`,
    `held_together`; without it, none). A common word that happens to be rare ("kept"
    beside `nonlocal`) is not what it asks about, and would take the place of the name's
    passages; one held with the name is what it asks of the name: a contract writes its
    defined terms in most of its clauses ("the Lessee", "the Trust"), and a question naming
    one is still about its rare words ("deposit", "account")."""
    rare = [word for word, count in counts.items() if 0 < count <= RARE_PASSAGES]
    names = {w for w in written_names(text, counts) if counts[w]}
    if often := {w for w in names if counts[w] > RARE_PASSAGES}:
        rare = [word for word in rare
                if word in names or (together is not None and together(word, often))]
    return rare, names


def held_together(store: Store, doc_ids: Sequence[int], word: str, names: Iterable[str]
                  ) -> bool:
    """Whether a passage of the documents `doc_ids` holds `word` (a rare one) and each of
    `names`."""
    for doc_id in doc_ids:
        ids = set(store.passages_holding(doc_id, word, RARE_PASSAGES))
        for name in names:
            ids &= set(store.passages_holding(doc_id, name, EVERY_PASSAGE)) if ids else set()
        if ids:
            return True
    return False


def asked_with(text: str) -> set[str]:
    """The words of ASKING that `text` writes as a question's words, not as a name (code,
    `any()`; capitalised past its first word, "William Tell")."""
    return set(ASKING) - written_names(text, ASKING)


def named(ranked: Sequence[tuple[Any, float]],
          holders: Mapping[str, set[int]]) -> list[tuple[int, float]]:
    """The passages holding the rare words (`holders`), as BM25 over those words `ranked`
    them (passage, score), then any it did not rank, those holding the most first. The index
    reads an identifier by its parts (`store.passages_holding`): BM25 over `__missing__`
    ranks every passage saying "missing", and may rank the ones holding it low."""
    held = set().union(*holders.values())
    first = [(p.id, score) for p, score in ranked if p.id in held]
    seen = {pid for pid, _ in first}
    rest = sorted(held - seen, key=lambda pid: (-sum(pid in ids for ids in holders.values()),
                                                pid))
    return first + [(pid, 0.0) for pid in rest]


def focused(order: Sequence[tuple[int, float]],
            share: float = FOCUS_SHARE) -> list[tuple[int, float]]:
    """The head of a fused ranking of (id, score), best first, that is worth reading: the
    entries scoring above `share` of the best (the best among them). Reciprocal rank fusion
    scores an entry found by one of two rankings at most half of one ranked first by both:
    for a question naming something rare, the passages that hold the name and match the rest
    of the question, not those sharing a common word or two with it. Each passage more beside
    the one that answers is a distraction a small model falls for (measured: RESULTS.md,
    "Answers over a long document against the model's ceiling"). Raw BM25 or cosine scores
    have no such scale, and a fusion with the dense ranking at a tenth of the weight leaves
    every passage near the best: neither is cut."""
    return [(pid, score) for pid, score in order if score > share * order[0][1]]


def most_named(order: Sequence[tuple[int, float]], holders: Mapping[str, set[int]],
               names: Iterable[str] = ()) -> list[tuple[int, float]]:
    """The entries of a focused ranking of (id, score) that hold the most of the question's
    rare words (`holders`: each word's passages); in order, ties all kept. The focus keeps
    every passage holding one of them, but the passage about what the question names holds
    the name's words and whatever else of the question it shares, where another shares one
    word by chance (a verb of the question found in two or three passages of a long text):
    a distraction as much as a passage holding none (measured: RESULTS.md, "Passage size
    and distraction"). A name the question writes (`names`: `written_names`) that none of
    those holds keeps the best entry holding it too: a question about two things reads a
    passage on each. A ranking none of whose entries holds one is returned as it is."""
    held = {pid: sum(pid in ids for ids in holders.values()) for pid, _ in order}
    most = max(held.values(), default=0)
    if not most:
        return list(order)
    kept = {pid for pid, _ in order if held[pid] == most}
    for name in sorted(set(names) & holders.keys()):
        if not holders[name] & kept:
            kept.update(next(([pid] for pid, _ in order if pid in holders[name]), []))
    return [(pid, score) for pid, score in order if pid in kept]


def refers_back(question: str) -> bool:
    """Whether `question` writes a word pointing back at what the chat was about."""
    return any(w in REFERS_BACK for w in re.findall(r"[a-z]+", question.lower()))


def written_names(question: str, words: Iterable[str]) -> set[str]:
    """Of `words` (case folded), the names `question` writes: capitalised past its first word,
    an identifier (a digit or an underscore in it), written as code: called (`f()`, not a
    plural's "(s)") or alone between backticks (`name`, `module.name`), or a name of several
    capitalised words (`name_phrases`)."""
    capitalised = {w.lower() for w in re.findall(r"\w+", question)[1:] if w[:1].isupper()}
    code = {w.lower() for part in re.findall(
        r"\b[A-Za-z_]\w*(?=\((?!s\)))|(?<=`)[A-Za-z_][\w.]*(?=`)", question)
        for w in part.split(".") if w}
    phrases = set(name_phrases(question))
    return {w for w in words
            if w in capitalised or w in code or w in phrases or re.search(r"[\d_]", w)}


MOST_PHRASES = 12  # of a question's names of several words, looked up in the index
LONGEST_NAME = 6  # words


def name_phrases(question: str) -> list[str]:
    """The names of several capitalised words `question` writes ("Ines Brandt", "New York
    Stock Exchange", "Zoë Ärnström"), case folded: each run of two or more capitalised words
    parted by spaces only (a possessive's "'s" ends it), and the shorter runs within it,
    longest first, at most MOST_PHRASES (a run of more than LONGEST_NAME words is a sentence
    in capitals, not a name). A question's first word, a title-case question or
    two names side by side make runs longer than the name; which of them the document holds
    as a name, its index says (`rare_phrases`). Each word of such a name may be common in a
    document (a staff table's first and last names) where the name itself is rare."""
    runs: list[list[str]] = []
    run: list[str] = []
    end = 0
    for m in re.finditer(r"\w[\w'\u2019-]*", question):
        word = m.group()
        if not (word[0].isupper() and (not run or not question[end:m.start()].strip())):
            runs.append(run)
            run = []
        if word[0].isupper():
            possessive = re.sub(r"['\u2019]s$", "", word)
            run.append(possessive)
            if possessive != word:
                runs.append(run)
                run = []
        end = m.end()
    runs.append(run)
    out = []
    for words in runs:
        if len(words) > LONGEST_NAME:  # a sentence in capitals, not a name
            continue
        for size in range(len(words), 1, -1):
            out += [" ".join(re.findall(r"\w+", " ".join(words[i:i + size]).lower()))
                    for i in range(len(words) - size + 1)
                    # ("When Did", "Is Ines": a question's words, not a name's)
                    if query_words(words[i]) and query_words(words[i + size - 1])]
    return list(dict.fromkeys(sorted(out, key=lambda p: -len(p.split()))))[:MOST_PHRASES]


def rare_phrases(store: Store, doc_id: int, question: str, counts: Mapping[str, int]
                 ) -> list[str]:
    """The names of several words `question` writes (`name_phrases`) that at most
    RARE_PASSAGES of the document's passages hold, when some word of theirs is not rare by
    itself (`counts`: {word: passages holding it, counted past RARE_PASSAGES}); else the
    words alone say as much."""
    return [p for p in name_phrases(question)
            if any(counts.get(w, 0) > RARE_PASSAGES for w in p.split())
            and 0 < len(store.passages_holding(doc_id, p, RARE_PASSAGES + 1)) <= RARE_PASSAGES]


def fuse(rankings: Sequence[Sequence[tuple[int, float]]],
         weights: Sequence[float] | None = None) -> list[tuple[int, float]]:
    """Reciprocal rank fusion of rankings of (id, score), best first; each ranking's share
    weighted (default: equally)."""
    fused: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings), strict=True):
        for rank, (pid, _) in enumerate(ranking, start=1):
            fused[pid] = fused.get(pid, 0.0) + weight / (RRF_K + rank)
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise EngineError(f"unknown retrieval mode {mode!r}: use one of {', '.join(MODES)}")
