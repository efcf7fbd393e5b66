"""A re-entrant lock that serves waiting threads in the order they arrived.

The chat context is one model context shared by every front end in a process (the window, the
local API's clients): a turn holds it from its restore to its stored answer. threading.RLock
hands a released lock to whichever waiter the OS wakes first, so a steady stream of requests
from one client could keep another waiting indefinitely; this lock queues them first come,
first served. `waiting` says how many are queued (the API reports it).

`ContextLock` is the attach context's: a background pass that holds it across many slices
(the exact pass) gives it up to an attach waiting for it (`urgent`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class FairLock:
    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._queue: deque[int] = deque()

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)

    @property
    def busy(self) -> bool:
        """Held, or wanted: what a background job yields to."""
        with self._cond:
            return self._owner is not None or bool(self._queue)

    def wait_free(self, cancel: threading.Event | None = None,
                  until: Callable[[], bool] | None = None) -> None:
        """Wait while the lock is `busy` (background work goes after the user's turns), or
        until `cancel` is set or `until()` is true; at once in the thread holding it."""
        me = threading.get_ident()
        with self._cond:
            while self._owner != me and (self._owner is not None or self._queue) and not (
                    cancel is not None and cancel.is_set()) and not (until and until()):
                # (a cancel or `until` sets no condition: looked at now and then)
                self._cond.wait(0.05)

    def acquire(self) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            self._queue.append(me)
            while self._owner is not None or self._queue[0] != me:
                self._cond.wait()
            self._queue.popleft()
            self._owner, self._depth = me, 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a FairLock not held by this thread")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


class ContextLock(FairLock):
    """The attach context's lock. Its order lets an attach in between two of the passage
    pass's passages; `urgent` says an attach is waiting (`first`), so that the exact pass,
    which holds the context for a whole chat and waits for the user's turns while holding it,
    gives it up at its next slice instead of keeping the attach waiting behind those turns."""

    def __init__(self):
        super().__init__()
        self._urgent = 0

    @property
    def urgent(self) -> bool:
        with self._cond:
            return self._urgent > 0

    @contextmanager
    def first(self) -> Iterator[None]:
        """Hold the lock, `urgent` while waiting for it: an attach's."""
        with self._cond:
            self._urgent += 1
        try:
            self.acquire()
        finally:
            with self._cond:
                self._urgent -= 1
        try:
            yield
        finally:
            self.release()
