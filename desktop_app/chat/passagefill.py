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

It never touches the chat context and never decides what a chat holds.
"""

from __future__ import annotations

import logging

from store import BudgetFullError, DiskFullError, Store

from ..kv.contexts import ATTACH, Contexts
from ..kv.passagekv import PassageKV
from ..results import size_text
from .background import Background
from .fairlock import ContextLock, FairLock

log = logging.getLogger(__name__)


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

    def notes(self) -> dict[int, str]:
        """Why the pass over a document stopped short, by document id ("the storage budget
        (30.0 MB) is full"); none for a document whose pass goes on, or is done."""
        return dict(self._notes)

    def resume(self) -> None:
        """Queue every long document (what a pass stopped by a restart left undone)."""
        for doc_id in self.store.passage_counts():
            self.request(doc_id)

    def work(self, doc_id: int) -> None:
        """Compute the KV of every passage of document `doc_id` that has none, or damaged KV."""
        self._notes.pop(doc_id, None)  # (going again: said again if it stops again)
        for passage in self.store.passages(doc_id):  # (a deleted document has none)
            self.yield_to_turns()
            with self.attach_lock:
                rt = self.contexts.get(ATTACH)
                if not self.kv.kept(rt) or self.store.damage:  # (nothing can be stored)
                    return
                # (One set aside, or the head it extends, is computed again: `ensure`.)
                entry = self.kv.entry(rt, passage.text)
                if entry is not None and not self.store.damaged(
                        [i for i in (entry.id, entry.parent_id) if i is not None]):
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
