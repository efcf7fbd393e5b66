"""Low-priority work on one thread of its own, item by item, always after the user's turns.

`Background` queues items (a chat to make exact, a document whose passages need their KV),
each at most once while pending, and works them in order on a daemon thread started on the
first request. `yield_to_turns` is what the work calls between its slices: it waits while the
chat context is busy answering, so a question waits at most for the slice being computed, and
raises Cancelled once the engine closes. A failed item is logged and skipped: background work
is never in the way of an answer. `idle` is set whenever nothing is queued (tests wait on it).

It knows nothing of what an item means: `exactness` and `passagefill` do.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from ..errors import Cancelled, is_user_error
from .fairlock import FairLock

log = logging.getLogger(__name__)


class Background:
    name = "kv-background"  # the thread's name
    what = "background work on"  # for the log: "the {what} {item} failed"

    def __init__(self, chat_lock: FairLock):
        self.chat_lock = chat_lock  # busy: the user is being answered
        self.cancel = threading.Event()
        self.idle = threading.Event()
        self.idle.set()
        self._pending: queue.Queue = queue.Queue()
        self._queued: set = set()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def request(self, item) -> None:
        """Work `item` when there is time (once, if asked again before it is done)."""
        with self._guard:
            if item in self._queued or self.cancel.is_set():
                return
            self._queued.add(item)
            self.idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        self._pending.put(item)

    def stop(self) -> None:
        """Stop without waiting: the item being worked raises Cancelled at its next slice."""
        self.cancel.set()
        self._pending.put(None)

    def close(self) -> None:
        """Stop, and wait for the item being worked to end."""
        self.stop()
        if self._thread is not None:
            self._thread.join()

    def yield_to_turns(self, until: Callable[[], bool] | None = None) -> None:
        """Wait while a question is being answered, or until `until()`; Cancelled once
        closing."""
        self.chat_lock.wait_free(self.cancel, until)  # the user goes first
        if self.cancel.is_set():
            raise Cancelled("closing")

    def work(self, item) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while (item := self._pending.get()) is not None:
            try:
                self.work(item)
            except Cancelled:
                return
            except Exception as e:  # noqa: BLE001 - a failed item leaves what it stored
                # a full disk, say, is the user's to act on and said so; a bug, with its trace
                log.warning("the %s %s failed%s", self.what, item,
                            f": {e}" if is_user_error(e) else "", exc_info=not is_user_error(e))
            finally:
                with self._guard:
                    self._queued.discard(item)
                    if not self._queued:
                        self.idle.set()
