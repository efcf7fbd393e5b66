"""A chat's turn: waiting for it while another kvdesk process holds it (or a document's
attach), and what to say when it does not fit the context.

The store's file locks (`store.datadir.locks`) serve one process at a time across a data directory.
`waited(turn, key, ...)` holds one for the caller, says so through `progress` when it has to
wait ("wait" 0 of 1), and turns a cancel while waiting into `Cancelled`, as every cancelled
flow ends. It never holds a lock of its own and never decides what runs in the turn.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from store.datadir.locks import TurnCancelled

from ..errors import Cancelled
from ..results import Progress


@contextlib.contextmanager
def waited(turn: Callable[..., contextlib.AbstractContextManager], key, *,
           cancel: threading.Event | None, progress: Callable[[Progress], None] | None,
           title: str = "") -> Iterator[None]:
    """`turn(key, cancel=..., on_wait=...)` held for the caller (`Store.chat_turn`,
    `Store.attach_turn`)."""
    def waiting() -> None:
        if progress is not None:
            progress(Progress("wait", 0, 1, title))

    try:
        with turn(key, cancel=cancel, on_wait=waiting):
            yield
    except TurnCancelled as e:
        raise Cancelled(str(e)) from None


def room_left(n_ctx: int, context: int, question: int, chat_id: int | None) -> str:
    """Why a question (`question` tokens, its turn) does not fit after `context` tokens."""
    if chat_id is None:  # a new chat already: the question, or what comes before it
        return (f"the question is {question:,} tokens, with the {context:,} before it (the "
                f"system prompt and documents) too long for the {n_ctx:,}-token context: "
                "shorten it" + (", or ask about fewer or shorter documents"
                                if context > n_ctx // 4 else ""))
    return (f"the chat is full: {context + question:,} tokens of a {n_ctx:,}-token context; "
            "start a new chat")
