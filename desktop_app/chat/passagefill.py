"""Every passage of a long document given its KV in the background, so that no question waits.

A question computes the passages it retrieves that have no KV yet (`longdoc`); this pass
computes all the others, one passage at a time in document order, in the attach context,
after a long document is attached and whenever a long-running kvdesk (the window, `kvdesk
serve`) starts. It is resumable by construction: a passage's KV is an entry keyed by its
content (`kv.passagekv`), stored whole or not at all, so after a restart (or a kill) the pass
finds what is stored and goes on with the rest. It is low priority: before each passage it
waits while the chat context is busy, so a question waits at most for the one passage being
computed (~1 s on 2 cores), and it stops when the engine closes (that passage is not stored).
It stops too when the storage budget would have to evict other KV to keep going: passage KV
never pushes out what questions used. `kvdesk docs` shows its progress (passages with KV).

It never touches the chat context and never decides what a chat holds.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from store import Store

from ..errors import Cancelled
from ..kv.contexts import ATTACH, Contexts
from ..kv.passagekv import PassageKV
from .fairlock import FairLock

log = logging.getLogger(__name__)


class PassageFill:
    def __init__(self, store: Store, contexts: Contexts, kv: PassageKV, *,
                 chat_lock: FairLock, attach_lock: threading.RLock):
        self.store = store
        self.contexts = contexts
        self.kv = kv
        self.chat_lock = chat_lock  # busy: the user is being answered
        self.attach_lock = attach_lock  # the attach context is shared with attaching
        self.cancel = threading.Event()
        self.idle = threading.Event()
        self.idle.set()
        self._pending: queue.Queue[int | None] = queue.Queue()
        self._queued: set[int] = set()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def request(self, doc_id: int) -> None:
        """Compute the KV of every passage of document `doc_id` that has none (once queued)."""
        with self._guard:
            if doc_id in self._queued or self.cancel.is_set():
                return
            self._queued.add(doc_id)
            self.idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kv-passages",
                                                daemon=True)
                self._thread.start()
        self._pending.put(doc_id)

    def resume(self) -> None:
        """Queue every long document (what a pass stopped by a restart left undone)."""
        for doc_id in self.store.passage_counts():
            self.request(doc_id)

    def close(self) -> None:
        self.cancel.set()
        self._pending.put(None)
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while (doc_id := self._pending.get()) is not None:
            try:
                self._fill(doc_id)
            except Cancelled:
                return
            except Exception:  # noqa: BLE001 - a failed pass leaves what it stored
                log.warning("the passage pass of document %s failed", doc_id, exc_info=True)
            finally:
                with self._guard:
                    self._queued.discard(doc_id)
                    if not self._queued:
                        self.idle.set()

    def _fill(self, doc_id: int) -> None:
        for passage in self.store.passages(doc_id):  # (a deleted document has none)
            while self.chat_lock.busy:  # the user goes first
                if self.cancel.is_set():
                    raise Cancelled("closing")
                time.sleep(0.05)
            if self.cancel.is_set():
                raise Cancelled("closing")
            with self.attach_lock:
                rt = self.contexts.get(ATTACH)
                if self.kv.entry(rt, passage.text) is not None:
                    continue
                full = self.store.usage_bytes() >= self.store.budget_bytes
                try:
                    if not full:
                        ready = self.kv.ensure(rt, [(doc_id, passage.text)], cancel=self.cancel)
                        # Evicted as soon as stored: it only pushed other KV out.
                        full = bool(ready.computed) and self.kv.entry(rt, passage.text) is None
                finally:
                    rt.reset()
                if full:
                    log.info("the passage pass of document %s stopped: the storage budget is "
                             "full", doc_id)
                    return
