"""FairLock: re-entrant, and waiting threads get it in the order they asked."""

from __future__ import annotations

import threading
import time

import pytest

from desktop_app.chat.fairlock import FairLock


def test_waiters_are_served_in_arrival_order():
    lock, order = FairLock(), []
    lock.acquire()
    threads = []
    for i in range(6):
        t = threading.Thread(target=lambda i=i: (lock.acquire(), order.append(i),
                                                  lock.release()))
        t.start()
        threads.append(t)
        while lock.waiting < i + 1:  # queued before the next one asks
            time.sleep(0.001)
    lock.release()
    for t in threads:
        t.join(5)
    assert order == list(range(6))


def test_reentrant_and_owned():
    lock = FairLock()
    with lock, lock:
        assert lock.waiting == 0
    with pytest.raises(RuntimeError):
        lock.release()
