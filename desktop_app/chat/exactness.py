"""The exact prefix of a blended chat, computed in the background and stored.

A chat over several documents first answers from their caches blended (approximate, never
stored). Then this pass computes the chat's whole context exactly — a prefill of its
documents and turns — in the attach context, and stores it as the chat's entry, so its later
turns and reopens are exact. It is low priority: it computes in small slices and waits while
the chat context is busy, so the user's next question never waits for more than a slice, and
an attach waiting for the context takes it at the next slice (the chat's is computed again
after it); it can be cancelled (closing the engine) and stores nothing of a pass that does
not finish; a chat deleted meanwhile makes the store refuse the entry, and a context that is
no longer the start of the chat's when it is computed (a document of it deleted, a turn
replaced meanwhile) is computed again as the chat is now.

A process about to exit (a one-shot `kvdesk ask`) would take the pass with it: it waits for
the pass instead (`finish`), showing how far it got, and may stop waiting (Ctrl-C), which
leaves the chat blended for its next turn. What storing it evicted is said once (`said`): by
the command that waited for it; else in the log (`kvdesk serve`'s, the window's) and then by the
window's next look at its chats, or with the chat's next answer.

A sliding-window model resumes a restore only where a stored entry ends with its window, so
for one the pass also stores the chat's documents or passages as an entry of their own on its
way (`_compute`): another chat over them resumes there.

It never touches the chat context itself: it only tells the session when a chat became exact.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from store import DiskFullError, NotFoundError

from ..kv.contexts import ATTACH, Contexts
from ..kv.kvcache import KVCache
from ..model.runtime import PREFILL_SLICE
from ..results import Progress
from .background import Background
from .fairlock import ContextLock, FairLock

# Tokens computed between checks for a waiting question: a plain prefill's slice (~1 s on 2
# cores), since llama.cpp's results depend on how tokens are batched: the stored context is
# what a prefill of its tokens computes (a sliding-window model's, from where its documents
# or passages end on: what a restore resuming there computes).
SLICE = PREFILL_SLICE

log = logging.getLogger(__name__)


class _GiveWay(Exception):
    """An attach waits for the attach context: the pass gives it up (`yield_to_turns`)."""


class Exactness(Background):
    name = "kv-exact"
    what = "exact pass of chat"

    def __init__(self, contexts: Contexts, kv: KVCache, *, chat_lock: FairLock,
                 attach_lock: ContextLock, conversation: Callable, documents: Callable,
                 first_document: Callable, prefix: Callable, on_exact: Callable[[int], None]):
        super().__init__(chat_lock)
        self.contexts = contexts
        self.kv = kv
        self.attach_lock = attach_lock  # the attach context is shared with attaching
        self.conversation = conversation  # (runtime, chat id) -> (messages, tokens, notes)
        self.documents = documents  # chat id -> its documents
        self.first_document = first_document  # (runtime, chat id) -> what its entry extends
        self.prefix = prefix  # (runtime, chat id) -> its documents' or passages' Layout
        self.on_exact = on_exact
        self._stored: set[int] = set()  # chats whose exact context a pass stored
        self._too_big: set[int] = set()  # ... computed, and evicted by the budget at once
        self._progress: dict[int, tuple[int, int]] = {}  # chat id: (tokens done, of)
        self._said: dict[int, list[str]] = {}  # chat id: what its pass evicted, until told
        self._waited: set[int] = set()  # chats a `finish` waits for (it tells the user)

    def said(self, chat_id: int | None = None) -> dict[int, list[str]]:
        """What the passes that stored chats' exact contexts evicted for them (the notes of
        `KVCache.eviction_notes`), by chat id, each handed over once: to the command that
        waited for it (`finish`), the window's next look at its chats, or the chat's next
        answer; of chat `chat_id` alone, if given."""
        with self._guard:
            if chat_id is not None:
                return {chat_id: self._said.pop(chat_id)} if chat_id in self._said else {}
            said, self._said = self._said, {}
            return said

    def finish(self, chat_id: int, *, progress: Callable[[Progress], None] | None = None,
               cancel: threading.Event | None = None, ask: bool = False) -> bool:
        """Wait for chat `chat_id`'s pass, queued or under way (or with `ask`, asked for now),
        reporting its progress once its context is loaded; stop waiting when `cancel` is set
        (the pass goes on). Whether its exact context is stored (False: no pass was asked
        for, it failed, or the wait was cancelled). What it evicted: `said`."""
        with self._guard:  # (waited for before it is asked: a quick pass never logs it too)
            self._waited.add(chat_id)
        if ask:
            self.request(chat_id)
        try:
            while True:
                with self._guard:
                    if chat_id not in self._queued:
                        return chat_id in self._stored
                    done, total = self._progress.get(chat_id, (0, 0))
                if cancel is not None and cancel.is_set():
                    return False
                if progress is not None and total:
                    progress(Progress("exact", done, total))
                time.sleep(0.1)
        finally:
            with self._guard:
                self._waited.discard(chat_id)

    def work(self, chat_id: int) -> None:
        """Compute chat `chat_id`'s exact context and store it; after any attach that wanted
        the context meanwhile (queued before this pass again), from the start again."""
        while True:
            try:
                return self._work(chat_id)
            except _GiveWay:
                pass

    def yield_to_turns(self) -> None:
        """Before each slice: an attach waiting for the context takes it now (`_GiveWay`), and
        the user's turns go first (a question's wait is one slice at most). Cancelled once
        closing."""
        super().yield_to_turns(until=lambda: self.attach_lock.urgent)
        if self.attach_lock.urgent:
            raise _GiveWay()

    def _work(self, chat_id: int) -> None:
        evicted: list[dict] = []  # (what storing it, and its documents' entry, evicted)
        with self.attach_lock:
            rt = self.contexts.get(ATTACH)
            try:
                tokens: list[int] | None = None
                # A turn asked meanwhile extends the context computed: it is stored, and the
                # next turn starts from it. Passages changed by a follow-up, a document of the
                # chat deleted (before or while it is stored) or a turn replaced make it no
                # longer the start of the chat's: the chat's context as it is now is computed
                # instead. Its documents are read before its tokens: none deleted since is in
                # them, and the store refuses an entry holding one deleted (NotFoundError).
                while True:
                    docs = [d.id for d in self.documents(chat_id)]
                    now = self.conversation(rt, chat_id)[1]
                    if tokens is not None and now[:len(tokens)] == tokens:
                        try:
                            # (what it supersedes dropped only if still the chat's start:
                            # a turn replaced or re-blended meanwhile is newer than this)
                            kept = self.kv.store_chat(
                                rt, chat_id, tokens, self.first_document(rt, chat_id),
                                evicted=evicted, holds=docs, drop=lambda held=tokens:
                                self.conversation(rt, chat_id)[1][:len(held)] == held)
                            break
                        except NotFoundError:
                            if [d.id for d in self.documents(chat_id)] == docs:
                                raise  # (not a document deleted: a chat deleted, or a bug)
                    tokens = now
                    self._compute(rt, chat_id, tokens, docs, evicted)
            finally:
                rt.reset()
                with self._guard:
                    self._progress.pop(chat_id, None)
            # (one too large for the budget is not an eviction: `too_big` says it of the chat)
            # (said after its answer, elsewhere: it names what was stored)
            said = self.kv.eviction_notes([c for c in evicted if not c.get("too_large")],
                                          rt.fingerprint,
                                          stored=f"chat {chat_id}'s exact context")
        with self._guard:
            (self._stored if kept else self._too_big).add(chat_id)
            if said:  # (added to any a pass before it left untold)
                self._said.setdefault(chat_id, []).extend(said)
            logged = chat_id not in self._waited  # (one waiting says it: not twice)
        for note in said if logged else ():  # (`kvdesk serve`'s log, the window's: unasked)
            log.warning("%s", note)
        if kept:
            self.on_exact(chat_id)

    def _compute(self, rt, chat_id: int, tokens: list[int], docs: list[int],
                 evicted: list[dict]) -> None:
        """Compute `tokens` from the first. A sliding-window model's restore resumes only
        where a stored entry ends, with its window: the chat's documents or passages are
        stored as an entry of their own on the way, so that another chat over them (the same
        question asked anew, in a new process too) resumes after them, not near token 0."""
        with self._guard:  # under way: its context is loaded (`finish` says so from now)
            self._progress[chat_id] = (0, len(tokens))
        rt.reset()
        prefix = self.prefix(rt, chat_id).tokens if rt.layout.swa_layers else ()
        cut = len(prefix) if tuple(tokens[:len(prefix)]) == prefix else 0
        ends = sorted({*range(SLICE, len(tokens), SLICE), len(tokens), cut} - {0})
        for start, end in zip([0, *ends[:-1]], ends, strict=True):
            self.yield_to_turns()
            rt.prefill(tokens[start:end], cancel=self.cancel, logits=False)
            if end == cut < len(tokens):
                try:
                    self.kv.store_prefix(rt, tokens[:cut], holds=docs, cancel=self.cancel,
                                         evicted=evicted)
                except (DiskFullError, NotFoundError) as e:  # (a way point: the pass goes on)
                    log.info("the documents of chat %s are not stored on their own: %s",
                             chat_id, e)
            with self._guard:
                self._progress[chat_id] = (end, len(tokens))

    def too_big(self, chat_id: int) -> bool:
        """Whether chat `chat_id`'s exact context was computed but is larger than the storage
        budget, which evicted it at once (the chat stays blended)."""
        with self._guard:
            return chat_id in self._too_big


class ExactNotes:
    """The engine's `exact_notes` (protocol.EngineAPI): what the window shows of its exact
    passes' evictions (a chat's next answer carries those it has not shown)."""

    exactness: Exactness

    def exact_notes(self) -> dict[int, list[str]]:
        return self.exactness.said()
