"""FairLock: re-entrant, and waiting threads get it in the order they asked; ContextLock: an
attach waiting for the attach context gets it from the exact pass at its next slice."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from test_store_helpers import FP, open_store, put_entry

from desktop_app.chat.exactness import SLICE, Exactness
from desktop_app.chat.fairlock import ContextLock, FairLock
from desktop_app.kv.kvcache import KVCache


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


def test_an_attach_takes_the_context_from_the_exact_pass_waiting_for_a_turn(tmp_path):
    """The exact pass holds the attach context for a whole chat and waits for the user's turns
    between its slices: an attach waited behind those turns too (26-134 s for small files
    while a probe's chats were answered). It now gives the context up to a waiting attach,
    and computes the chat's context from the start after it."""
    store = open_store(tmp_path / "data")
    chat = store.create_chat("blended")
    tokens = list(range(1, 3 * SLICE + 1))
    prefilled: list[int] = []
    rt = SimpleNamespace(fingerprint=FP, layout=SimpleNamespace(swa_layers=()),
                         reset=lambda: None,
                         prefill=lambda piece, **kw: prefilled.extend(piece))
    cache = KVCache(store, ("lossless",), 16, calibrations=None)
    cache.store_prefix = lambda rt, held, chat_id=None, **kw: put_entry(
        store, held, chunk_size=16, chat_id=chat_id)
    chat_lock, context = FairLock(), ContextLock()
    exact = Exactness(SimpleNamespace(get=lambda name: rt), cache, chat_lock=chat_lock,
                      attach_lock=context, conversation=lambda rt, c: ([], tokens, []),
                      documents=lambda c: [], first_document=lambda rt, c: None,
                      prefix=None, on_exact=lambda c: None)
    attached, seen = threading.Event(), []
    chat_lock.acquire()  # a turn is being answered
    try:
        exact.request(chat.id)
        deadline = time.monotonic() + 5
        while not context.busy and time.monotonic() < deadline:  # the pass holds the context
            time.sleep(0.01)
        assert context.busy and not prefilled  # (waiting for the turn before its first slice)

        def attach() -> None:
            with context.first():
                seen.append(len(prefilled))
                attached.set()
        attacher = threading.Thread(target=attach, daemon=True)
        attacher.start()
        assert attached.wait(5), "the attach waited for the turn the exact pass waits for"
        attacher.join(5)
    finally:
        chat_lock.release()  # the turn ends: the pass goes on, after the attach
    assert exact.finish(chat.id)  # stored: computed whole, from the start
    assert seen == [0] and prefilled == tokens
    assert store.longest_prefix(FP, tokens, touch=False).n_tokens == len(tokens)
    exact.close()
    store.close()
