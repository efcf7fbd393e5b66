"""Degenerate repetition: the benchmark's measure, and the guard that stops a looping answer,
on scripted token streams (no model)."""

from __future__ import annotations

import itertools
import re
import time
from types import SimpleNamespace

from desktop_app.chat.answers import stream_answer
from desktop_app.chat.repetition import MIN_SPAN, LoopGuard, repeated_sentence
from desktop_app.model.runtime import Token
from desktop_app.options import GenerationOptions

LOOP = ("You can charge money for copies of the Program. You can charge money for the use of "
        "the Program. ") * 13
FINE = ("Yes. You may charge a fee for the physical act of transferring a copy. You may also "
        "offer support or warranty protection for a fee. Yes. The licence itself stays free.")


def test_a_repeated_sentence_is_found_and_a_varied_answer_passes():
    assert repeated_sentence(LOOP) == "you can charge money for copies of the program"
    assert repeated_sentence(FINE) is None  # "Yes." twice is too short to count
    # List markers and case aside, a repeated item is the same sentence.
    assert repeated_sentence("1. A copy of the License.\n2. a copy of the license") is not None
    assert repeated_sentence("1. A copy of the License.\n2. A copy of the NOTICE file.") is None


def feed_text(guard: LoopGuard, pieces) -> tuple[int, str | None]:
    """Feed text pieces as tokens (ids from the text); how many went in, and the verdict."""
    for n, piece in enumerate(pieces, 1):
        verdict = guard.feed(hash(piece) % 50_000, piece)
        if verdict:
            return n, verdict
    return n, None


def words(text: str) -> list[str]:
    return [w + " " for w in text.split()]


def test_a_token_loop_stops_once_it_has_repeated_three_times():
    cycle = words("the licence the licence covers")  # 5 tokens a cycle
    n, verdict = feed_text(LoopGuard(), itertools.islice(itertools.cycle(cycle), 200))
    # period 5: the run must reach MIN_SPAN tokens (32 > 2 x 5) after the first cycle
    assert n == len(cycle) + MIN_SPAN and "repeat every 5" in verdict


def test_a_long_period_loop_needs_three_whole_copies():
    cycle = [f"w{i} " for i in range(40)]  # 40 distinct tokens, no sentence boundary
    n, verdict = feed_text(LoopGuard(), cycle * 5)
    assert n == 3 * 40 and "repeat every 40" in verdict


def test_a_sentence_said_three_times_stops_even_when_its_tokens_differ():
    # Numbered list items: the numbers differ, so the token stream is not periodic.
    items = [f"{i}. A copy of the License (LSD)\n" for i in range(1, 10)]
    n, verdict = feed_text(LoopGuard(), [w for item in items for w in re.findall(r"\S+\s*", item)])
    assert verdict and "a copy of the license lsd" in verdict and "3 times" in verdict
    assert n == 3 * 7  # at the line break that ends the third


def test_ordinary_text_never_trips_the_guard():
    text = (FINE + " ") * 1 + " ".join(f"Section {i} says something else entirely about item "
                                       f"{i * 7}." for i in range(60))
    assert feed_text(LoopGuard(), words(text))[1] is None
    # A column of numbers is not a loop either, nor a short repeated word.
    assert feed_text(LoopGuard(), [f"{i}, " for i in range(300)])[1] is None
    assert feed_text(LoopGuard(), ["Yes. "] * 20)[1] is None


class ScriptedRuntime:
    """What `_answer` uses of a Runtime, streaming scripted tokens."""

    n_ctx, n_tokens = 4096, 100

    def __init__(self, pieces, answer_stops=()):
        self.pieces = pieces
        self.closed = False
        self.options = None
        self.chat_template = SimpleNamespace(answer_stops=answer_stops)
        self.cut_to, self.computed = None, []

    def can_truncate(self, n):
        return True

    def truncate(self, n):
        self.cut_to = n

    def tokenize(self, text):
        return [hash(text) % 50_000]

    def prefill(self, tokens):
        self.computed += tokens

    def generate(self, max_tokens, *, options, cancel=None, chat=True, grammar=None):
        self.options, self.grammar = options, grammar
        try:
            for piece in self.pieces[:max_tokens]:
                yield Token(hash(piece) % 50_000, piece)
        finally:
            self.closed = True  # the real runtime evaluates the last token here


def test_a_looping_answer_is_stopped_and_the_user_told():
    rt = ScriptedRuntime(words(LOOP))
    streamed = []
    out = stream_answer(rt, GenerationOptions(max_tokens=512), time.perf_counter(), streamed.append,
                  None)
    assert rt.closed and len(out.tokens) < 60 < len(rt.pieces)
    assert out.text == "".join(streamed)  # what was shown is what is kept
    (note,) = out.notes
    assert "stopped after" in note and "going round in circles" in note


def test_a_good_answer_runs_to_its_end():
    rt = ScriptedRuntime(words(FINE))
    out = stream_answer(rt, GenerationOptions(max_tokens=8), time.perf_counter(), None, None)
    assert len(out.tokens) == 8 and out.notes == [] and out.ttft is not None
    assert rt.options.max_tokens == 8


def test_a_base_models_answer_ends_where_it_begins_the_next_question():
    """Gemma 3 270M asked in plain text wrote "...used to bindQuestion:" in a follow-up: the
    next question begun on the answer's own line, which no line break ended."""
    pieces = [" It", " binds", " a", " name", ".", "Question", ":", " What", " else", "?"]
    rt = ScriptedRuntime(pieces, answer_stops=("Question:",))
    streamed = []
    out = stream_answer(rt, GenerationOptions(max_tokens=64), time.perf_counter(),
                        streamed.append, None)
    assert out.text == "".join(streamed) == " It binds a name."
    assert len(out.tokens) == 5 and not out.cut and rt.closed
    # the context cut back to the answer's own tokens: the stop string's 2 dropped
    assert rt.cut_to == 100 - 2 and rt.computed == []
    # a piece the stop string begins in: its part before it computed again as text
    run_on = [" It", " binds", " a", " name.Quest", "ion:", " What"]
    rt = ScriptedRuntime(run_on, answer_stops=("Question:",))
    out = stream_answer(rt, GenerationOptions(max_tokens=64), time.perf_counter(), None, None)
    assert out.text == " It binds a name." and rt.cut_to == 100 - 2
    assert out.tokens[:3] == [hash(p) % 50_000 for p in run_on[:3]]
    assert out.tokens[3:] == rt.computed == [hash(" name.") % 50_000]
    # a prompt continued as it is (chat=False) has no template to end it
    raw = stream_answer(ScriptedRuntime(pieces, answer_stops=("Question:",)),
                        GenerationOptions(max_tokens=64), time.perf_counter(), None, None,
                        chat=False)
    assert raw.text == "".join(pieces) and raw.cut is False


def json_pieces(text: str) -> list[str]:
    """JSON text as a model's tokens might split it: words, numbers, punctuation, indents."""
    return re.findall(r"\n *|\w+|[^\w\s]|\s", text)


# Pretty-printed, as models write JSON: each item's lines repeat, with four words or more.
ITEMS = "[\n" + ",\n".join(
    f'  {{\n    "id": {i},\n    "unit": "degrees celsius per hour",\n    "note": "read at the '
    f'north gate station"\n  }}' for i in range(1, 30)) + "\n]"


def test_json_held_to_a_grammar_is_watched_for_runs_only():
    """An array of similar objects repeats its lines by design: the sentence guard would stop
    it at the third item; a held answer's guard (sentences=False) lets it run to its end,
    and still stops a run of repeating tokens (a string of "1111...")."""
    assert feed_text(LoopGuard(), json_pieces(ITEMS))[1] is not None  # (prose's guard)
    assert feed_text(LoopGuard(sentences=False), json_pieces(ITEMS))[1] is None
    n, verdict = feed_text(LoopGuard(sentences=False), ['{"size": "', *["1"] * 100])
    assert verdict and "repeat every 1" in verdict and n < 40


def test_a_held_answer_stopped_in_a_loop_is_cut_as_at_its_limit():
    """Its JSON is incomplete: finish_reason "length", never "stop", which clients parse."""
    rt = ScriptedRuntime(['{"size": "', *["1"] * 100])
    out = stream_answer(rt, GenerationOptions(max_tokens=512), time.perf_counter(), None, None,
                        grammar="root ::= ...")
    assert rt.grammar == "root ::= ..." and out.notes and out.cut
    plain = stream_answer(ScriptedRuntime(words(LOOP)), GenerationOptions(max_tokens=512),
                          time.perf_counter(), None, None)
    assert plain.notes and not plain.cut  # prose stopped in a loop: a whole answer
