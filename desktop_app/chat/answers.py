"""An answer streamed out of the model: its tokens to the caller as they come, stopped early
when it goes round in circles (`repetition.LoopGuard`), would overflow the context, or meets a
stop string (`StopStrings`: a request's, or the chat template's own); what reaches the user
begins at its first visible character (`from_first_visible`).

It only generates from what the context holds: bringing a chat in and storing the turn are the
session's (`sessions`, `completions`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..model.runtime import Runtime
from ..options import GenerationOptions
from .repetition import LoopGuard

# The context's tokens an answer leaves free for the turn's closing (the template's
# end-of-turn tokens, appended after it so the next turn extends the context exactly).
CLOSING_ROOM = 8


@dataclass(frozen=True)
class Answer:
    tokens: list[int]
    text: str
    ttft: float | None  # seconds from t0 to the first token (None: no token)
    notes: list[str]  # why it stopped early, when it did
    cut: bool  # it ran to its limit: max_tokens, or the room left in the context


def stream_answer(rt: Runtime, generation: GenerationOptions, t0: float,
                  on_token: Callable[[str], None] | None,
                  cancel: threading.Event | None, *, chat: bool = True,
                  grammar: str | None = None) -> Answer:
    """Stream an answer sampled with `generation` (resolved: every field set), stopping it if
    it loops (`chat` False: a prompt continued as it is, see `Runtime.generate`); held to
    `grammar` (GBNF: `answerformat.AnswerFormat`) if given.

    A held answer (JSON) is watched for runs of repeating tokens only: its lines repeat by
    design (an array of objects says `"unit": "degrees celsius"` in each), while a run, a
    string of "1111..." or the same item over and over, is as much a loop in JSON as in prose.
    Stopped, it is incomplete JSON, so it is `cut` as at max_tokens: a client reading a
    finish of "stop" parses it whole."""
    generated: list[int] = []
    pieces: list[str] = []
    ttft, notes = None, []
    guard = LoopGuard(sentences=grammar is None)
    # A base model asked in plain text may go on to the next "Question:" with no line
    # break first: the answer ends where it begins (held back until the next pieces decide).
    own = StopStrings(rt.chat_template.answer_stops, on_token) if chat else None
    stopped = False
    max_new = min(generation.max_tokens, rt.n_ctx - rt.n_tokens - CLOSING_ROOM)
    # closing: a loop left early still evaluates its last token, so the context holds it.
    with contextlib.closing(rt.generate(max_new, options=generation, cancel=cancel,
                                        chat=chat, grammar=grammar)) as stream:
        for tok in stream:
            if ttft is None:
                ttft = time.perf_counter() - t0
            generated.append(tok.id)
            pieces.append(tok.text)
            if own is not None and own.stop:
                if stopped := own.feed(tok.text):
                    break
            elif on_token and tok.text:
                on_token(tok.text)
            loop = guard.feed(tok.id, tok.text)
            if loop:
                notes.append(f"the answer was stopped after {len(generated)} tokens because "
                             f"it was going round in circles: {loop}")
                break
    text = own.finish() if own is not None and own.stop else "".join(pieces)
    if stopped:
        generated = _cut_back(rt, generated, pieces, text)
    return Answer(generated, text, ttft, notes, cut=bool(grammar and notes) or
                  not notes and not stopped and len(generated) >= max_new)


def _cut_back(rt: Runtime, generated: list[int], pieces: list[str], text: str) -> list[int]:
    """The answer's tokens ending where its `text` does, before the template's stop string,
    and the context cut back to them: what is stored of the turn (its tokens, then its
    closing) is then what its text renders. Where a sliding-window cache cannot go back so
    far, all of them, as the context holds them."""
    kept, length = 0, 0
    while kept < len(pieces) and length + len(pieces[kept]) <= len(text):
        length += len(pieces[kept])
        kept += 1
    rest = rt.tokenize(text[length:]) if length < len(text) else []
    at = rt.n_tokens - (len(generated) - kept)
    if not rt.can_truncate(at):
        return generated
    rt.truncate(at)
    if rest:  # (the piece the stop string began in: its part before it)
        rt.prefill(rest)
    return generated[:kept] + rest


def from_first_visible(on_token: Callable[[str], None] | None
                       ) -> Callable[[str], None] | None:
    """`on_token` passed a chat answer's pieces from its first visible character, as the
    answer is stored: a model asked "...Answer:" writes a space first (Gemma 3 270M). The
    context keeps it; only what the user is shown loses it."""
    if on_token is None:
        return None
    started = False

    def feed(piece: str) -> None:
        nonlocal started
        if not started:
            piece = piece.lstrip()
            started = bool(piece)
        if piece:
            on_token(piece)
    return feed


class StopStrings:
    """Streams an answer's text while watching for stop strings: nothing that may turn out to
    be the start of one is passed on until the next pieces decide, and the text is cut where
    the first one begins."""

    def __init__(self, stop: Sequence[str], on_token: Callable[[str], None] | None):
        self.stop = [x for x in stop if x]
        self.on_token = on_token
        self.text = ""
        self.sent = 0
        self.cut: int | None = None

    def feed(self, piece: str) -> bool:
        """Take the next piece; True once a stop string has appeared."""
        if self.cut is not None:
            return True
        self.text += piece
        # (where a stop string could begin: not in what was sent, a step back from its end)
        start = max(0, self.sent - max(map(len, self.stop), default=0))
        found = [i for i in (self.text.find(x, start) for x in self.stop) if i >= 0]
        if found:
            self.cut = min(found)
            self._send(self.cut)
            return True
        held = max((k for x in self.stop for k in range(1, len(x))
                    if self.text.endswith(x[:k])), default=0)
        self._send(len(self.text) - held)
        return False

    def finish(self) -> str:
        """The answer as generated, leading whitespace included (what the context holds):
        cut at its stop string, or all of it (then sent in full)."""
        if self.cut is None:
            self._send(len(self.text))
            return self.text
        return self.text[:self.cut]

    def _send(self, upto: int) -> None:
        if upto > self.sent:
            piece = self.text[self.sent:upto]
            if self.on_token:
                self.on_token(piece)
            self.sent = upto
