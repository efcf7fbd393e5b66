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


def test_background_work_waits_while_the_lock_is_held_or_wanted():
    lock, cancel = FairLock(), threading.Event()
    lock.wait_free(cancel)  # free: at once
    with lock:  # its owner does not wait on itself
        lock.wait_free(cancel)
    held, released, waited = threading.Event(), threading.Event(), []

    def hold():
        with lock:
            held.set()
            released.wait()

    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    waiter = threading.Thread(target=lambda: (lock.wait_free(cancel), waited.append(1)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not waited
    released.set()
    waiter.join(5)
    assert waited == [1]
    t.join()
    with lock:
        other = threading.Thread(target=lambda: lock.wait_free(cancel))
        other.start()
        cancel.set()  # a cancel ends the wait though the lock is still held
        other.join(5)
        assert not other.is_alive()
