"""The sentences of a question's passages that name what it asks about: its evidence.

A small model given a few passages often answers from the wrong one, copying text that sits
near the fact (measured: RESULTS.md, "Why the answers over a long document miss"). The
sentences of the passages read that hold the question's rarest words (a name, an identifier:
those in the fewest of the document's passages) are what the answer rests on; the chat room
quotes them in the question's own turn, nearest the answer (`naming`). A document read whole
beside the passages (a page of notes beside a book) is quoted for the words the book hardly
holds (`beside`), and a name the question writes that the book never holds is found
(`unnamed`): the passages read are then only the nearest, and nothing is quoted as its answer.
That claim must be true and about a name: the book holds the word in no form (inflected, or
inside a compound: "Bäcker" in "Bäckermeister"), and a capitalised word is a name only in a
book whose language does not capitalise its nouns (`capitalises_nouns`: German does).

Words and text only: it never reads a model, a tokenizer or any KV, and it never decides
which passages are read (`retrieve` does).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from store import Store
from store.words import CJK_CHAR

from .records import RECORDS
from .retrieve import RARE_PASSAGES, frequencies, rare_phrases, written_names

MOST = 3  # sentences quoted at most: past a few, the quote is a passage again
LONGEST = 300  # characters kept of each
# A text capitalises its nouns (German) when at least this share of its words past a
# sentence's first, counted as written and counted once each, start with a capital. Measured
# (RESULTS.md, "Capitalised nouns are not names"): German prose 0.22-0.52, English,
# French, Russian and others 0.02-0.18 (a lease's defined terms, 0.18 of its words, are
# 0.13 of its vocabulary; a changelog's contributors, 0.16 of its vocabulary, 0.10 of its
# words).
NOUN_CAPITALS = 0.2
SAMPLE = 20_000  # characters of each of a text's three places measured (its start, middle, end)
FEWEST_WORDS = 200  # a text with fewer words past a sentence's first is too short to tell
# A word past a sentence's first: after a word and at most a comma and one line break.
_MID_SENTENCE = re.compile(r"[^\W\d_]+[ \t]*,?[ \t]*\n?[ \t]*(?=([^\W\d_]+))")

# A full stop before a word in lower case ends no sentence either ("waits 90 s. before").
# Chinese and Japanese end theirs with 。！？ or ．, any closing quote or bracket after it
# theirs too, and no space after.
_CLOSING = "」』）)”’"
_BREAK = re.compile(r"(?<=[.!?])\s+(?![\sa-z])|\n\s*\n|"
                    f"(?:(?<=[。！？．])(?![{_CLOSING}。！？．])|(?<=[。！？．][{_CLOSING}]))\\s*")
# A title or an initial before a name ends no sentence ("Dr. Voktenvok ...", "J. R. Smith").
_TITLE = re.compile(r"(?:\b(?:Dr|Mr|Mrs|Ms|Prof|St|Mt|No|vs|e\.g|i\.e)|\b[A-Z])\.$")


# A line of source code: a comment, a decorator or an import at its start; an assignment, a
# call or an underscored identifier in it (not a keyword at its start: prose lines start
# "for", "if" or "with" too). Code has no full stops to end its "sentences": its lines are
# its sentences.
_CODE = re.compile(
    r"^\s*(?:#|//|/\*|\*\s|@\w|import\s+[\w.]+|from\s+[\w.]+\s+import\b)|"
    r"\w\s*(?:[-+*/|&]?=(?!=)|==)|\b[A-Za-z_]\w*\(|\w_\w")
# Half a sign of code: a bracket, colon or semicolon at a line's end, a closing bracket or a
# quote at its start. Prose wraps so too (a contract's clauses end in ";", "Requirements:",
# a line of dialogue opens with a quote), so these alone never make a run code.
_CODE_ENDS = re.compile(r"[\[{(:;}\]]\s*$|^\s*[\]})\"']")


def sentences(text: str) -> list[str]:
    """`text`'s sentences (and paragraphs, which end one too), whitespace as written; in a
    run of lines mostly of source code, each line (a quote of code is the line naming the
    word, not the block around it)."""
    spans: list[tuple[int, int]] = []
    start = 0
    for end, after in [*((m.start(), m.end()) for m in _BREAK.finditer(text)),
                       (len(text), len(text))]:
        if spans and _TITLE.search(text[slice(*spans[-1])]):
            spans[-1] = (spans[-1][0], end)
        elif text[start:end].strip():
            spans.append((start, end))
        start = after
    return [line for a, b in spans for line in _code_lines(text[a:b])]


def _code_lines(sentence: str) -> list[str]:
    """`sentence`'s lines if it is a run of three or more and more than half of them are
    source code (`_CODE` counted whole, `_CODE_ENDS` half), else `sentence`: two wrapped
    lines are quoted whole whatever they are."""
    lines = [line for line in sentence.split("\n") if line.strip()]
    code = sum(2 if _CODE.search(line) else _CODE_ENDS.search(line) is not None
               for line in lines)  # (in halves)
    return lines if len(lines) >= 3 and code > len(lines) else [sentence]


def _cut(sentence: str) -> str:
    """`sentence` cut where, its whitespace runs counted as one space, it reaches LONGEST
    characters (indentation does not shorten a quote): before the word that crosses it, not
    in it (an identifier cut in two reads as another), unless that would keep under half."""
    n, before = -1, (0, 0)  # (characters counted, where the last whole word ends)
    for word in re.finditer(r"\S+", sentence):
        n += 1 + len(word.group())
        if n > LONGEST and before[0] >= LONGEST // 2:
            return sentence[:before[1]]
        if n >= LONGEST:
            return sentence[:word.end() - (n - LONGEST)]
        before = (n, word.end())
    return sentence


def _stem(word: str) -> str:
    return word if "_" in word else word[:max(4, len(word) - 3)]


def _pattern(word: str) -> str:
    """`word` matched as the index matches it: its stem, or a name of several words whole,
    whatever parts them that the index does not read (a line break, `SKU: S12-1`'s colon and
    hyphen), from the start of a word; a CJK pair (`store.words`) wherever it is written,
    a line's wrap between its characters too."""
    if CJK_CHAR.match(word):
        return r"\s*".join(map(re.escape, word))
    return r"\b" + (r"\W+".join(map(re.escape, word.split())) + r"\b" if " " in word
                    else re.escape(_stem(word)))


def naming(store: Store, doc_id: int, question: str, texts: Sequence[str],
           most: int = MOST, *, kind: str = "text") -> list[str]:
    """The sentences of `texts` (document `doc_id`'s passages, in the order read) holding the
    question's rarest words (of its names, when it writes any), at most `most`, each as the
    passage writes it (line breaks kept: a turn quoting it repeats the passage's tokens, whose
    KV a blend reuses) and cut to LONGEST characters; none when the question names nothing
    rare, or when none of the names it writes is in the document (the sentences of another
    name would be quoted as the answer's: "the Harrowgate conveyor" answered with the
    Tarnwick one's payload). A word is matched on its first letters, as a stem ("remembering"
    finds "remember"), the way the full-text index matches it; an identifier with an
    underscore, as it is written; a name of several words (`retrieve.name_phrases`) rare
    where its words are not, as written. In a document of records (`kind`: `records.RECORDS`)
    a record is a line, and the lines are quoted."""
    counted = frequencies(store, doc_id, question, RARE_PASSAGES + 1)
    if (written := written_names(question, counted)) and not any(
            counted[w] for w in written) and unnamed(store, [doc_id], question):
        return []
    phrases = rare_phrases(store, doc_id, question, counted)
    # A word of a rare name stands for it ("Brandt" of "Ines Brandt"): not for another's.
    within = {w for p in phrases for w in p.split()}
    counts = {w: c for w, c in counted.items() if 0 < c <= RARE_PASSAGES and w not in within}
    counts |= {p: 1 for p in phrases}
    return _quoting(counts, question, texts, most, lines=kind in RECORDS)


def unnamed(store: Store, doc_ids: Sequence[int], question: str,
            texts: Sequence[str] = ()) -> list[str]:
    """The names `question` writes (as it writes them) that no passage of the documents
    `doc_ids` holds, nor any of `texts` (documents read whole beside them): what an answer
    cannot be about, however near the passages read come to it."""
    found = _counted(store, doc_ids, question, 1)
    missing = {w for w in written_names(question, found)
               if not found[w] and not any(_holds(t, w) for t in texts)}
    if missing:  # (the index holds words as written: the books' text says what it holds else)
        books = [*(store.document(d).text for d in doc_ids), *texts]
        if any(capitalises_nouns(b) for b in books):
            # A capital says nothing there: only a name's form does (code, a digit, an
            # underscore), which the question in lower case still shows.
            missing = written_names(question.lower(), missing)
        # Held in no form: its stem nowhere, even inside a word (an inflection, "Leuchtturms"
        # for "Leuchtturm"; a compound, "Wärter" in "Leuchtturmwärter").
        folded = [b.casefold() for b in books] if missing else []
        missing = {w for w in missing if not any(_stem(w).casefold() in b for b in folded)}
    return list(dict.fromkeys(w for w in re.findall(r"\w+", question) if w.lower() in missing))


def capitalises_nouns(text: str) -> bool:
    """Whether `text` is in a language that capitalises its nouns (German), where a capital
    says nothing of a name: at least NOUN_CAPITALS of its words past a sentence's first start
    with one, both as written and once each (a lease writes its few defined terms in every
    clause; a changelog names many people once), in SAMPLE characters of its start, middle and
    end (a title-case contents or a table alone is not the text's language). Words in capitals
    alone (an acronym, a heading) are not counted."""
    mid = len(text) // 2
    sample = "\n\n".join({text[:SAMPLE], text[max(0, mid - SAMPLE // 2):mid + SAMPLE // 2],
                           text[-SAMPLE:]})
    words = [w for w in _MID_SENTENCE.findall(sample) if not (len(w) > 1 and w.isupper())]
    if len(words) < FEWEST_WORDS:
        return False
    kinds = set(words)
    return (sum(w[0].isupper() for w in words) >= NOUN_CAPITALS * len(words)
            and sum(w[0].isupper() for w in kinds) >= NOUN_CAPITALS * len(kinds))


def beside(store: Store, books: Sequence[int], question: str, text: str,
           most: int = MOST) -> tuple[list[str], list[str]]:
    """The sentences of `text` (a document read whole beside the passages of the documents
    `books`) holding the question's words that it holds and those documents hardly do: what
    the question asks of it rather than of them ("Where is the on-call phone?" of a page of
    notes beside a manual), at most `most`, as `naming` quotes them. (Those for words in
    none of the books' passages, those for words in at most RARE_PASSAGES of them.)"""
    counts = _counted(store, books, question, RARE_PASSAGES + 1)
    held = {w: c for w, c in counts.items() if c <= RARE_PASSAGES and _holds(text, w)}
    return (_quoting({w: c for w, c in held.items() if c == 0}, question, [text], most),
            _quoting(held, question, [text], most))


def _counted(store: Store, doc_ids: Sequence[int], question: str, at_most: int
             ) -> dict[str, int]:
    """{word of the question: how many passages of the documents hold it} (each document's
    count stopping at `at_most`)."""
    counts: dict[str, int] = {}
    for doc_id in doc_ids:
        for w, c in frequencies(store, doc_id, question, at_most).items():
            counts[w] = counts.get(w, 0) + c
    return counts


def _holds(text: str, word: str) -> bool:
    """Whether `text` holds `word`, matched on its stem as the index matches it."""
    return re.search(_pattern(word), text, re.IGNORECASE) is not None


def _quoting(counts: dict[str, int], question: str, texts: Sequence[str], most: int, *,
             lines: bool = False) -> list[str]:
    """The sentences of `texts` holding the words of `counts` ({word: passages holding it})
    that fewest passages hold, of the names the question writes when it writes any; with
    `lines`, the lines holding them (a document of records: a line is one record)."""
    # A name the question writes (capitalised past its first word, or an identifier) says
    # what it is about; a common word that happens to be rare in this document does not
    # ("kept" in "How many boxes are kept at the Vokunevok depot?").
    names = written_names(question, counts)
    if names:
        counts = {w: c for w, c in counts.items() if w in names}
    if not counts:
        return []
    fewest = min(counts.values())
    stems = re.compile("(?:" + "|".join(_pattern(w) for w, c in counts.items()
                                           if c == fewest) + ")", re.IGNORECASE)
    found = {" ".join(s.split()): _quote(s.strip(), stems) for t in texts
             for s in (t.split("\n") if lines else sentences(t))
             if stems.search(s)}  # (each once, however it is wrapped)
    return list(found.values())[:most]


def _quote(sentence: str, stems: re.Pattern) -> str:
    """`sentence` cut to LONGEST characters, from its start if the cut still names a stem;
    else (a list or a table with no full stops runs on past it) from the start of the line
    that does, or, in a line longer than that, from a few words before the name."""
    cut = _cut(sentence)
    if stems.search(cut):
        return cut
    at = stems.search(sentence).start()
    line = sentence.rfind("\n", 0, at) + 1
    if len(" ".join(sentence[line:at].split())) > LONGEST // 2:
        words = [m.start() for m in re.finditer(r"\S+", sentence[line:at])]
        line += words[max(0, len(words) - 6)]
    return _cut(sentence[line:])
