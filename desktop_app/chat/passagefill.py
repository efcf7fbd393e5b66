"""Every passage of a long document given its KV in the background, so that no question waits.

A question computes the passages it retrieves that have no KV yet (`longdoc`); this pass
computes all the others (and again those whose KV was damaged and set aside), one passage at a
time in document order, in the attach context, after a long document is attached and whenever a
long-running kvdesk (the window, `kvdesk serve`) starts. It is resumable by construction: a
passage's KV is an entry keyed by its content (`kv.passagekv`), stored whole or not at all, so
after a restart (or a kill) the pass finds what is stored and goes on with the rest. It is low
priority: before each passage it waits while the chat context is busy, so a question waits at
most for the one passage being computed (~1 s on 2 cores), and it stops when the engine closes
(that passage is not stored). It stops too when the storage budget would have to evict other KV
to keep going, and says so (a warning in the log, with how far it got, and `notes` for the
window's document list, until the document's pass goes again: a changed budget, a restart):
passage KV never pushes out what questions used, and what it stores counts as least recently
used until a question reads it (store: an entry written not to evict), so a question's store
evicts it first. `kvdesk docs` shows its progress (passages with KV).

It is hours of CPU for a book, so it says what it does: `state` (the window's status bar: the
document, how far, the rate it measured), its log from info on (`kvdesk serve` prints it: a
line as it starts over a document with the disk its passages will take, how far it is at
most once a minute, a line as it ends or stops), and what an attach will cost
(`attach_notes`). `pause` holds it before its next passage until resumed; a restart resumes it.

It never touches the chat context and never decides what a chat holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from store import BudgetFullError, DiskFullError, NotFoundError, Store

from ..errors import Cancelled
from ..kv.contexts import ATTACH, Contexts
from ..kv.passagekv import PassageKV
from ..passagepass import LOGGER, MEASURED_AFTER, PassagePass, duration
from ..results import AttachResult, size_text
from .background import Background
from .fairlock import ContextLock, FairLock

log = logging.getLogger(LOGGER)
SAY_EVERY_S = 60  # the log says how far a pass is at most this often


class PassageFill(Background):
    name = "kv-passages"
    what = "passage pass of document"

    def __init__(self, store: Store, contexts: Contexts, kv: PassageKV, *,
                 chat_lock: FairLock, attach_lock: ContextLock):
        super().__init__(chat_lock)
        self.store = store
        self.contexts = contexts
        self.kv = kv
        self.attach_lock = attach_lock  # the attach context is shared with attaching
        self._notes: dict[int, str] = {}  # doc id -> why its pass stopped short
        self._running = threading.Event()  # cleared: paused by the user (`pause`)
        self._running.set()
        self._state = PassagePass()  # the document being worked, and how far it is
        self._rate = (0, 0.0)  # passages computed in this run, and the seconds they took
        self._said = 0.0  # when the log last said how far the pass is

    def notes(self) -> dict[int, str]:
        """Why the pass over a document stopped short, by document id ("the storage budget
        (30.0 MB) is full"); none for a document whose pass goes on, or is done."""
        return dict(self._notes)

    def state(self) -> PassagePass:
        """What the pass is doing now, from what it keeps in memory (`EngineAPI.passage_pass`)."""
        state, (computed, spent) = self._state, self._rate
        with self._guard:  # (the one being worked is among those queued until it ends)
            queued = len(self._queued - {state.doc_id})
        rate = 60 * computed / spent if computed >= MEASURED_AFTER and spent > 0 else None
        return replace(state, per_minute=rate, queued=queued,
                       paused=not self._running.is_set(), notes=self.notes())

    def pause(self, paused: bool) -> None:
        """Pause the pass before its next passage (the one being computed is finished), or
        let it go on. A pause lasts until resumed or until kvdesk next starts: the setting
        `passages_in_background` is what turns the pass off for good."""
        if paused == self._running.is_set():
            (self._running.clear if paused else self._running.set)()
            log.info("the passage pass is %s", "paused until resumed or the next start"
                     if paused else "resumed")

    def yield_to_turns(self, until=None) -> None:
        while not self._running.wait(0.1) and not self.cancel.is_set():
            pass  # paused by the user: until resumed, or closing
        super().yield_to_turns(until)

    def resume(self) -> None:
        """Queue every long document (what a pass stopped by a restart left undone)."""
        for doc_id in self.store.passage_counts():
            self.request(doc_id)

    def to_do(self, doc_id: int, rt) -> tuple[set[int], int, int | None, str]:
        """(the ids of document `doc_id`'s passages without their KV, its passages, about how
        many bytes their KV takes at the passage level and whence that is known; None: not)."""
        passages = self.store.passages(doc_id)
        held = self.store.passage_kv(rt.fingerprint).get(doc_id, {})
        missing = [p for p in passages if p.id not in held]
        per_token = self.kv.bytes_per_token(rt)
        size = None if per_token is None else round(per_token[0] * sum(p.tokens for p in missing))
        return {p.id for p in missing}, len(passages), size, per_token[1] if per_token else ""

    def cost(self, n: int, size: int | None, whence: str) -> str:
        """What giving `n` passages their KV takes, within the storage budget."""
        budget = size_text(self.store.budget_bytes)
        room = self.store.budget_bytes - self.store.usage_bytes()
        if size is None:
            return f"it stops when the storage budget ({budget}) is full"
        return (f"about {size_text(size)} at the passage level ({self.kv.level}, {whence})"
                + (f", within the storage budget ({budget})" if size <= room else
                   f"; it stops when the storage budget ({budget}) is full, and questions "
                   "compute the rest as they read them"))

    def attach_notes(self, result: AttachResult, levels: Sequence[str] | None,
                     background: bool) -> list[str]:
        """What an attach of a long document says of its passages' KV: the levels it was
        asked for do not apply, and what the background pass (`background`: the setting is
        on) will take of the disk, counted before it takes it."""
        notes = [f"the levels asked for ({', '.join(levels)}) do not apply to a document "
                 "kept as passages: each passage's KV is kept at one level, the setting "
                 f"passage_level ({self.kv.level})"] if levels else []
        if not result.passages or not background or not self.kv.kept(
                rt := self.contexts.loaded()):
            return notes
        missing, total, size, whence = self.to_do(result.doc_id, rt)
        n = len(missing)
        return notes + [
            f"{result.title}: {'its' if n == total else f'{n:,} of its'} {total:,} passages' "
            "caches are computed in the background while kvdesk runs (the window or `kvdesk "
            f"serve`), one at a time: {self.cost(n, size, whence)}; the setting "
            "passages_in_background turns this off"] if n else notes

    def work(self, doc_id: int) -> None:
        """Compute the KV of every passage of document `doc_id` that has none, or damaged KV,
        saying in the log when it starts, how far it is now and then, and when it ends."""
        self._notes.pop(doc_id, None)  # (going again: said again if it stops again)
        rt = self.contexts.get(ATTACH)
        if not self.kv.kept(rt):
            return  # (a model that keeps no passage KV yet: nothing to store)
        try:
            missing, total, size, whence = self.to_do(doc_id, rt)
            title = self.store.document(doc_id).title or f"document {doc_id}"
        except NotFoundError:
            return  # deleted meanwhile
        n, t0 = len(missing), time.monotonic()
        if n:  # (none: the pass only looks for damaged KV, computed again unsaid)
            self._state, self._said = PassagePass(doc_id, title, total - n, total), t0
            log.info("caching the KV of %s passages of document %s (%s) in the background, "
                     "one at a time: %s", f"{n:,}" + (f" of the {total:,}" if n < total else ""),
                     doc_id, title, self.cost(n, size, whence))
        try:
            self._fill(doc_id, missing)
        except Cancelled:
            if n:
                log.info("the passage pass of document %s (%s) stopped at %s of its %s "
                         "passages as kvdesk closed; the next start goes on", doc_id, title,
                         f"{self._state.done:,}", f"{total:,}")
            raise
        finally:
            done, self._state = self._state, PassagePass()
        if n and done.done >= done.total:
            log.info("the passage pass of document %s (%s) is done: its %s passages all have "
                     "their KV (%s)", doc_id, title, f"{total:,}",
                     duration(time.monotonic() - t0))

    def _fill(self, doc_id: int, missing: set[int]) -> None:
        for passage in self.store.passages(doc_id):  # (a deleted document has none)
            self.yield_to_turns()
            with self.attach_lock:
                began = time.monotonic()  # (the pass's own rate: no wait for a turn counts)
                rt = self.contexts.get(ATTACH)
                if not self.kv.kept(rt) or self.store.damage:  # (nothing can be stored)
                    return
                # (One set aside, or the head it extends, is computed again: `ensure`.)
                entry = self.kv.entry(rt, passage.text)
                if entry is not None and not self.store.damaged(
                        [i for i in (entry.id, entry.parent_id) if i is not None]):
                    self._state = replace(self._state, done=self._state.done
                                          + (passage.id in missing))  # (one named just now)
                    continue
                full = self.store.usage_bytes() >= self.store.budget_bytes
                try:
                    if not full:
                        self.kv.ensure(rt, [(doc_id, passage.text)], cancel=self.cancel,
                                       evict=False)
                except BudgetFullError:  # taken out again as soon as stored: it did not fit
                    full = True
                except DiskFullError as e:  # the work waits for room: asked again at a restart
                    log.warning("the passage pass of document %s stopped: %s", doc_id, e)
                    return
                except Exception:
                    if doc_id not in self.store.passage_counts():
                        return  # deleted meanwhile: its entry could not be stored for it
                    raise
                finally:
                    rt.reset()
                if full:
                    self.stopped(doc_id, rt.fingerprint)
                    return
                self._computed(began, new=passage.id in missing)

    def _computed(self, began: float, new: bool) -> None:
        """One more passage given its KV: counted, and said in the log now and then."""
        computed, spent = self._rate
        self._rate = (computed + 1, spent + time.monotonic() - began)
        self._state = replace(self._state, done=self._state.done + new)
        if self._state.doc_id is not None and time.monotonic() - self._said >= SAY_EVERY_S:
            self._said = time.monotonic()
            state = self.state()
            log.info("caching passages of document %s: %s%s", state.doc_id, state.line(),
                     f", {state.per_minute:.0f} a minute" if state.per_minute else "")

    def stopped(self, doc_id: int, fingerprint: str) -> None:
        """Say that the pass over document `doc_id` stopped at the storage budget, and where:
        the user reads it in the log of `kvdesk serve` (and in `kvdesk docs`), and on the
        document's row in the window (`notes`)."""
        self._notes[doc_id] = f"the storage budget ({size_text(self.store.budget_bytes)}) is full"
        held = self.store.passage_entries(fingerprint).get(doc_id, 0)
        log.warning("the passage pass of document %s stopped with %s of its %s passages given "
                    "their KV: the storage budget (%s) is full, and passages stored ahead of "
                    "need never evict others; the rest get theirs when a question reads them "
                    "(a larger setting storage_budget_gb gives them all theirs)", doc_id, held,
                    self.store.passage_counts().get(doc_id, 0), size_text(self.store.budget_bytes))
