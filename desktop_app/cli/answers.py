"""What `ask` and `reopen` say once an answer or a restore is done, beyond the engine's own
messages: that it was stopped or ran to its limit, and a blended chat's exact context, which a
one-shot computes before it exits.

Like the commands it serves, it holds no logic of the engine's, and never prints to stdout.
"""

from __future__ import annotations

import click

from ..app import App
from .base import TerminalProgress, interruptible, say, stopper


def answer_notes(res, *, stopped: bool, one_shot: bool) -> list[str]:
    """What `ask` says of an answer beyond the engine's messages: that it was stopped or ran
    to its limit, and a stopped blended chat's exact context left for its next turn (this
    process computes it otherwise: `finish_exact`)."""
    notes = []
    if stopped:
        notes.append(f"stopped ({stopper()}): the answer so far is kept")
    elif res.finish_reason == "length":
        n = res.tokens_generated
        notes.append(f"the answer stopped at its limit of {n:,} token{'' if n == 1 else 's'} "
                     "(--max-tokens, or the room left in the context): it may be cut short")
    if stopped and one_shot and res.blended and res.blended.get("mode") == "blended":
        notes.append("this chat's exact context was not computed (the answer was stopped): "
                     "its next turn offers it again")
    return notes


def finish_exact(app: App, chat_id: int, blended: dict | None) -> list[str]:
    """A blended chat's exact context, computed before this process exits (which would end
    the engine's background pass, storing nothing), with progress; Ctrl-C skips it. A server
    or the window computes it in the background instead: they keep running. It comes after
    the command's own text output: the answer and its report do not wait on it (--json's one
    object does, to carry them). What it said: how it went, and what storing it evicted."""
    if not blended or blended.get("mode") != "blended":
        return []
    bar = TerminalProgress()

    def progress(p) -> None:
        if bar.last is None:
            click.echo("Computing this chat's exact context, so that its next turns and "
                       "reopens are exact (Ctrl-C skips it)...", err=True)
        bar(p)

    # A one-shot engine starts no work its exit would cancel: the pass is asked for here.
    with interruptible() as cancel:
        stored = app.engine.exactness.finish(chat_id, progress=progress, cancel=cancel,
                                             ask=True)
    bar.done()
    if not stored:  # stopped now, nothing of it stored (and no context left loading)
        app.engine.exactness.close()
    said = (["the exact context is stored: the next turns and reopens of this chat are exact"]
        if stored else
        ["skipped: the chat stays blended, and its next turn offers this again"]
        if cancel.is_set() else
        ["the exact context is larger than the storage budget (storage_budget_gb), which "
         "evicted it at once: the chat stays blended"]
        if app.engine.exactness.too_big(chat_id) else
        ["the exact context could not be computed (the log says why): the chat stays "
         "blended"]) + app.engine.exactness.said(chat_id).get(chat_id, [])
    say(said)
    return said
