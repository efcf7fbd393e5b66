"""The exact prefix of a blended chat, computed in the background and stored.

A chat over several documents first answers from their caches blended (approximate, never
stored). Then this pass computes the chat's whole context exactly — a prefill of its
documents and turns — in the attach context, and stores it as the chat's entry, so its later
turns and reopens are exact. It is low priority: it computes in small slices and waits while
the chat context is busy, so the user's next question never waits for more than a slice; it
can be cancelled (closing the engine) and stores nothing of a pass that does not finish; a
chat or document deleted meanwhile makes the store refuse the entry, and that is all.

A process about to exit (a one-shot `kvdesk ask`) would take the pass with it: it waits for
the pass instead (`finish`), showing how far it got, and may stop waiting (Ctrl-C), which
leaves the chat blended for its next turn.

It never touches the chat context itself: it only tells the session when a chat became exact.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from ..errors import Cancelled
from ..kv.contexts import ATTACH, Contexts
from ..kv.kvcache import KVCache
from ..model.prompts import Prompter
from ..model.runtime import PREFILL_SLICE
from ..results import Progress
from .fairlock import FairLock
from .library import Library

# Tokens computed between checks for a waiting question: a plain prefill's slice, since
# llama.cpp's results depend on how tokens are batched and the stored context must equal what
# a prefill of the same tokens computes, bit for bit (~1 s on 2 cores).
SLICE = PREFILL_SLICE
log = logging.getLogger(__name__)


class Exactness:
    def __init__(self, contexts: Contexts, kv: KVCache, library: Library, prompter: Prompter,
                 *, chat_lock: FairLock, attach_lock: threading.RLock,
                 conversation: Callable, on_exact: Callable[[int], None]):
        self.contexts = contexts
        self.kv = kv
        self.library = library
        self.prompter = prompter
        self.chat_lock = chat_lock  # busy: the user is being answered
        self.attach_lock = attach_lock  # the attach context is shared with attaching
        self.conversation = conversation  # (runtime, chat id) -> (messages, tokens, notes)
        self.on_exact = on_exact
        self.pending: queue.Queue[int | None] = queue.Queue()
        self.cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._queued: set[int] = set()
        self._stored: set[int] = set()  # chats whose exact context a pass stored
        self._progress: dict[int, tuple[int, int]] = {}  # chat id: (tokens done, of)
        self._guard = threading.Lock()
        self.idle = threading.Event()
        self.idle.set()

    def request(self, chat_id: int) -> None:
        """Compute chat `chat_id`'s exact context when there is time (once, if asked twice)."""
        with self._guard:
            if chat_id in self._queued or self.cancel.is_set():
                return
            self._queued.add(chat_id)
            self.idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kv-exact", daemon=True)
                self._thread.start()
        self.pending.put(chat_id)

    def finish(self, chat_id: int, *, progress: Callable[[Progress], None] | None = None,
               cancel: threading.Event | None = None) -> bool:
        """Wait for chat `chat_id`'s pass, queued or under way, reporting its progress once its
        context is loaded; stop waiting when `cancel` is set (the pass goes on). Whether its
        exact context is stored (False: no pass was asked for, it failed, or the wait was
        cancelled)."""
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

    def close(self) -> None:
        self.cancel.set()
        self.pending.put(None)
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while (chat_id := self.pending.get()) is not None:
            try:
                self._exact(chat_id)
            except Cancelled:
                return
            except Exception:  # noqa: BLE001 - a failed pass leaves the chat as it was
                log.warning("the exact pass of chat %s failed", chat_id, exc_info=True)
            finally:
                with self._guard:
                    self._queued.discard(chat_id)
                    self._progress.pop(chat_id, None)
                    if not self._queued:
                        self.idle.set()

    def _exact(self, chat_id: int) -> None:
        with self.attach_lock:
            rt = self.contexts.get(ATTACH)
            _, tokens, _ = self.conversation(rt, chat_id)
            with self._guard:  # under way: its context is loaded (`finish` says so from now)
                self._progress[chat_id] = (0, len(tokens))
            rt.reset()
            try:
                for start in range(0, len(tokens), SLICE):
                    while self.chat_lock.busy:  # the user goes first
                        if self.cancel.is_set():
                            raise Cancelled("closing")
                        time.sleep(0.05)
                    rt.prefill(tokens[start:start + SLICE], cancel=self.cancel)
                    with self._guard:
                        self._progress[chat_id] = (min(start + SLICE, len(tokens)), len(tokens))
                docs = self.library.chat_documents(chat_id)
                first = (docs[0].id, self.prompter.prefix(rt, docs[0]).tokens) if docs else None
                self.kv.store_chat(rt, chat_id, tokens, first)
            finally:
                rt.reset()
        with self._guard:
            self._stored.add(chat_id)
        self.on_exact(chat_id)
