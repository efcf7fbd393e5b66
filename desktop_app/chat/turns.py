"""A chat's turn: waiting for it while another kvdesk process holds it (or a document's
attach), and the room its context has left: a question refused when it leaves too little for
an answer (`check_room`), and the user told as a chat fills up, before that (`filling`,
`fullness`).

The store's file locks (`store.datadir.locks`) serve one process at a time across a data directory.
`waited(turn, key, ...)` holds one for the caller, says so through `progress` when it has to
wait ("wait" 0 of 1), and turns a cancel while waiting into `Cancelled`, as every cancelled
flow ends. It never holds a lock of its own and never decides what runs in the turn.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

from store import Document
from store.datadir.locks import TurnCancelled

from ..errors import Cancelled, ChatFullError, EngineError
from ..results import Progress, counted
from .answers import CLOSING_ROOM

# The least room a question must leave for its answer, else it is refused as a full chat's
# is: an answer of fewer tokens is cut short mid-phrase (none at all: an empty turn stored,
# "stopped at its limit of 0 tokens"). 16 tokens is one short sentence; a caller asking for
# fewer (`max_tokens`) needs only those.
MIN_ANSWER_TOKENS = 16
# The tokens of the shortest next question's turn (a word in the chat template's markers):
# a chat with less room than this and an answer's is full before anything is typed.
MIN_QUESTION_TOKENS = 8
# The shares of the context whose crossing a turn says (once each: not at every turn after),
# so a chat is told twice how much room it has left before a question is refused.
FILLING = (0.8, 0.9)


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


def check_room(n_ctx: int, context: int, question: int, chat_id: int | None,
               docs: Sequence[Document], max_tokens: int) -> None:
    """Refuse a question (`question` tokens, its turn) after `context` tokens that leaves too
    little room for its answer: ChatFullError in a chat (about `docs`)."""
    if n_ctx - context - question - CLOSING_ROOM >= min(MIN_ANSWER_TOKENS, max_tokens):
        return
    if chat_id is None:  # a new chat already: the question, or what comes before it
        raise EngineError(
            f"the question is {question:,} tokens, with the {context:,} before it (the "
            f"system prompt and documents) too long for the {n_ctx:,}-token context "
            "with room for an answer: shorten it"
            + (", or ask about fewer or shorter documents" if context > n_ctx // 4 else ""))
    total = context + question
    raise ChatFullError(f"the chat is full: {total:,} tokens of a {n_ctx:,}-token context"
                        + ("" if total >= n_ctx else ", too few left for an answer")
                        + f"; {_go_on(docs, n_ctx)}",
                        () if _crowding(docs, n_ctx) else tuple(d.id for d in docs))


def _go_on(docs: Sequence[Document], n_ctx: int) -> str:
    """What goes on: a new chat over the same documents, unless they take most of the context
    themselves (a new chat over them is as full after an answer or two). A document longer
    than the context is read from its passages: it takes no more than they do."""
    if held := _crowding(docs, n_ctx):
        return (f"its documents alone take about {held:,} of the {n_ctx:,} tokens, so a new "
                "chat over them has little more room: a larger context (--n-ctx, or the "
                "context size in the settings) or shorter answers (--max-tokens) give it more")
    return "start a new chat" + (" over the same documents" if docs else "") + \
        " (this chat's turns do not go with it)"


def _crowding(docs: Sequence[Document], n_ctx: int) -> int:
    """The tokens `docs` take where they take over half the context (else 0)."""
    held = sum(n for d in docs if (n := d.n_tokens or 0) < n_ctx)
    return held if held > n_ctx // 2 else 0


def filling(n_ctx: int, before: int, after: int, docs: Sequence[Document]) -> list[str]:
    """What a turn that took the chat from `before` to `after` tokens says of the room left,
    when it crossed one of the FILLING shares: how many more turns of its size fit."""
    if not any(before < share * n_ctx <= after for share in FILLING):
        return []
    more = max(0, n_ctx - CLOSING_ROOM - after) // max(1, after - before)
    return [f"this chat now fills {after:,} of the {n_ctx:,}-token context "
            f"({100 * after // n_ctx} %): " + (
                f"about {counted(more, 'more turn')} like this one "
                f"{'fits' if more == 1 else 'fit'}, then {_go_on(docs, n_ctx)}"
                if more else f"another turn like this one does not fit; {_go_on(docs, n_ctx)}")]


def full(n_ctx: int, tokens: int) -> bool:
    """Whether a chat of `tokens` has no room for even a one-word question and its answer."""
    return n_ctx - tokens - MIN_QUESTION_TOKENS - CLOSING_ROOM < MIN_ANSWER_TOKENS


def fullness(n_ctx: int, tokens: int, docs: Sequence[Document]) -> list[str]:
    """What reopening a chat of `tokens` says of its room, from the first FILLING share on."""
    if tokens < FILLING[0] * n_ctx:
        return []
    said = f"this chat fills {tokens:,} of the {n_ctx:,}-token context ({100 * tokens // n_ctx} %)"
    if full(n_ctx, tokens):
        return [f"{said}: it is full, and a question in it is refused; {_go_on(docs, n_ctx)}"]
    return [f"{said}: {n_ctx - tokens:,} tokens are left for its next questions and answers, "
            f"then {_go_on(docs, n_ctx)}"]
