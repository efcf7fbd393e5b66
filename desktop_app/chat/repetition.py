"""Degenerate repetition: an answer caught in a loop, told apart from one that merely reuses
words.

Two measures of the same failure, shared so the guard and the benchmark agree:
- `repeated_sentence(text)`: a sentence (at least MIN_WORDS words, list markers and case
  aside) that occurs twice; benchmarks/bench_answers.py counts the answers that have one.
- `LoopGuard`, fed the tokens of an answer as they stream: says when the answer has become a
  loop, so generation stops and the user is told. It is the last resort after the sampler's
  repetition penalty, so it waits for certainty: a third copy of a sentence, or a run of
  tokens repeating with a period of at most MAX_PERIOD tokens, three times over and over at
  least MIN_SPAN tokens.

Pure: it sees token ids and text, never a model.
"""

from __future__ import annotations

import re
from collections import Counter

MIN_WORDS = 4
SENTENCE_REPEATS = 3
MAX_PERIOD = 64
MIN_SPAN = 32

# A sentence ends at . ! ? followed by white space, or at a line break.
_BOUNDARY = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")
# A list item's marker: "- ", "* ", "• ", "3. ", "3) ".
_MARKER = re.compile(r"^(?:[-*\u2022]|\d+[.)])\s+")
_WORD = re.compile(r"\w+")


def normalized(sentence: str) -> str | None:
    """The words of a sentence, lower-cased, without its list marker; None when it is too
    short to count (a repeated "Yes." or "Example:" is no loop)."""
    words = _WORD.findall(_MARKER.sub("", sentence.strip()).lower())
    return " ".join(words) if len(words) >= MIN_WORDS else None


def sentences(text: str) -> list[str]:
    """The normalized sentences of `text` long enough to count, in order."""
    return [s for s in map(normalized, _BOUNDARY.split(text)) if s]


def repeated_sentence(text: str) -> str | None:
    """The first sentence of `text` that occurs at least twice, or None."""
    counts = Counter(sentences(text))
    return next((s for s in counts if counts[s] > 1), None)


class LoopGuard:
    """Watches an answer's tokens; `feed` returns why it is a loop, once it is one (with
    `sentences` False, by its runs of repeating tokens only: for JSON, whose lines repeat)."""

    def __init__(self, *, sentences: bool = True):
        self._sentences = sentences
        self._tokens: list[int] = []
        # runs[p]: how many tokens in a row, up to the last, equal the token p before them
        self._runs = [0] * (MAX_PERIOD + 1)
        self._pending = ""  # text since the last sentence boundary
        self._seen: Counter[str] = Counter()

    def feed(self, token: int, text: str) -> str | None:
        self._tokens.append(token)
        n = len(self._tokens)
        for p in range(1, min(MAX_PERIOD, n - 1) + 1):
            if self._tokens[-1] == self._tokens[-1 - p]:
                self._runs[p] += 1
                if self._runs[p] >= max(2 * p, MIN_SPAN):
                    return f"its last {self._runs[p] + p} tokens repeat every {p}"
            else:
                self._runs[p] = 0
        if not self._sentences:
            return None
        *done, self._pending = _BOUNDARY.split(self._pending + text)
        for sentence in filter(None, map(normalized, done)):
            self._seen[sentence] += 1
            if self._seen[sentence] >= SENTENCE_REPEATS:
                return f"it said \u201c{_shorten(sentence)}\u201d {SENTENCE_REPEATS} times"
        return None


def _shorten(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"
