"""A re-entrant lock that serves waiting threads in the order they arrived.

The chat context is one model context shared by every front end in a process (the window, the
local API's clients): a turn holds it from its restore to its stored answer. threading.RLock
hands a released lock to whichever waiter the OS wakes first, so a steady stream of requests
from one client could keep another waiting indefinitely; this lock queues them first come,
first served. `waiting` says how many are queued (the API reports it).
"""

from __future__ import annotations

import threading
from collections import deque


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

    def wait_free(self, cancel: threading.Event | None = None) -> None:
        """Wait while the lock is `busy` (background work goes after the user's turns), or
        until `cancel` is set; at once in the thread holding it."""
        me = threading.get_ident()
        with self._cond:
            while self._owner != me and (self._owner is not None or self._queue) and not (
                    cancel is not None and cancel.is_set()):
                self._cond.wait(0.05)  # (a cancel sets no condition: looked at now and then)

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
