"""An answer streamed out of the model: its tokens to the caller as they come, stopped early
when it goes round in circles (`repetition.LoopGuard`) or would overflow the context; what
reaches the user begins at its first visible character (`from_first_visible`).

It only generates from what the context holds: bringing a chat in and storing the turn are the
session's (`sessions`, `completions`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..model.runtime import Runtime
from ..options import GenerationOptions
from .repetition import LoopGuard


@dataclass(frozen=True)
class Answer:
    tokens: list[int]
    text: str
    ttft: float | None  # seconds from t0 to the first token (None: no token)
    notes: list[str]  # why it stopped early, when it did
    cut: bool  # it ran to its limit: max_tokens, or the room left in the context


def stream_answer(rt: Runtime, generation: GenerationOptions, t0: float,
                  on_token: Callable[[str], None] | None,
                  cancel: threading.Event | None, *, chat: bool = True) -> Answer:
    """Stream an answer sampled with `generation` (resolved: every field set), stopping it if
    it loops (`chat` False: a prompt continued as it is, see `Runtime.generate`)."""
    generated: list[int] = []
    pieces: list[str] = []
    ttft, notes = None, []
    guard = LoopGuard()
    max_new = min(generation.max_tokens, rt.n_ctx - rt.n_tokens - 8)
    # closing: a loop left early still evaluates its last token, so the context holds it.
    with contextlib.closing(rt.generate(max_new, options=generation, cancel=cancel,
                                        chat=chat)) as stream:
        for tok in stream:
            if ttft is None:
                ttft = time.perf_counter() - t0
            generated.append(tok.id)
            pieces.append(tok.text)
            if on_token and tok.text:
                on_token(tok.text)
            loop = guard.feed(tok.id, tok.text)
            if loop:
                notes.append(f"the answer was stopped after {len(generated)} tokens because "
                             f"it was going round in circles: {loop}")
                break
    return Answer(generated, "".join(pieces), ttft, notes,
                  cut=not notes and len(generated) >= max_new)


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
