"""Concurrency: several threads sharing one Store, and several processes sharing one data
directory, write and read at once without "database is locked" or torn reads.

Run as a script, this file is one of those processes.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from store import Store

FP = "model-c"
LEVELS = ("lossless", "compact")


def chunk_bytes(worker: int, i: int, chunk: int, level: str) -> bytes:
    return f"{worker}/{i}/{chunk}/{level}|".encode() * 5_000


def tokens_of(worker: int, i: int) -> list[int]:
    return [worker, i] + list(range(300 + 37 * i))


def work(store: Store, worker: int, rounds: int) -> None:
    """Write entries and messages, and read back everything written so far by anyone."""
    chat = store.create_chat(f"worker {worker}")
    for i in range(rounds):
        with store.write_entry(FP, tokens_of(worker, i), levels=LEVELS) as writer:
            for span in writer.spans:
                for level in LEVELS:
                    writer.put_chunk(
                        span.chunk_index, level, chunk_bytes(worker, i, span.chunk_index, level)
                    )
        store.add_message(chat.id, "assistant", f"{worker}/{i}")
        for entry in store.entries():
            match = store.longest_prefix(FP, store.tokens(entry.id))
            assert match.n_tokens == entry.token_end
            for span in match.spans:
                assert store.read_chunk(span.entry_id, span.chunk_index, "compact")
        assert [m.text for m in store.messages(chat.id)] == [f"{worker}/{j}" for j in range(i + 1)]


def check(store: Store, workers: int, rounds: int) -> None:
    assert len(store.entries()) == workers * rounds
    for worker in range(workers):
        for i in range(rounds):
            match = store.longest_prefix(FP, tokens_of(worker, i))
            (entry,) = match.entries
            assert match.n_tokens == entry.token_end
            for span in match.spans:
                for level in LEVELS:
                    data = store.read_chunk(entry.id, span.chunk_index, level)
                    assert data == chunk_bytes(worker, i, span.chunk_index, level)
    assert store.verify()["corrupt"] == []


def test_threads_share_one_store(tmp_path):
    with Store(tmp_path) as store:
        store.register_model(FP, "/m.gguf", {})
        errors: list[BaseException] = []

        def run(worker: int) -> None:
            try:
                work(store, worker, rounds=6)
            except BaseException as error:  # surfaced in the main thread below
                errors.append(error)

        threads = [threading.Thread(target=run, args=(worker,)) for worker in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        check(store, workers=6, rounds=6)


def test_connections_of_finished_threads_are_closed(tmp_path):
    with Store(tmp_path) as store:
        for _ in range(5):
            thread = threading.Thread(target=store.chats)
            thread.start()
            thread.join()
        # Left: the main thread's and the last worker's (closed when the next thread connects).
        assert len(store._db._open) == 2


def test_processes_share_one_data_directory(tmp_path):
    with Store(tmp_path) as store:
        store.register_model(FP, "/m.gguf", {})
    processes = [
        subprocess.Popen(
            [sys.executable, __file__, str(tmp_path), str(worker), "5"],
            stderr=subprocess.PIPE,
            text=True,
        )
        for worker in range(4)
    ]
    failures = [p.stderr.read() for p in processes if p.wait() != 0]
    assert failures == []
    with Store(tmp_path) as store:
        check(store, workers=4, rounds=5)


if __name__ == "__main__":
    with Store(sys.argv[1]) as store:
        work(store, int(sys.argv[2]), int(sys.argv[3]))


def test_a_chat_turn_waits_for_another_holder_and_can_be_cancelled(tmp_path):
    from store.datadir.locks import TurnCancelled

    with Store(tmp_path) as one, Store(tmp_path) as two:  # as two processes would
        chat = one.create_chat("c").id
        order, waited = [], threading.Event()
        held = two.chat_turn(chat, on_wait=waited.set)  # kept: dropping it would release it
        with one.chat_turn(chat):
            worker = threading.Thread(target=lambda: (held.__enter__(), order.append("two")))
            worker.start()
            assert waited.wait(5)  # told that another holder has the turn
            order.append("one")
        worker.join(5)
        assert order == ["one", "two"]
        stop = threading.Event()
        stop.set()
        with pytest.raises(TurnCancelled):  # `two` still holds it: waiting is cancellable
            with one.chat_turn(chat, cancel=stop):
                pass
        with one.chat_turn(chat + 1):  # other chats are not held up
            pass


def test_an_attach_waits_for_another_of_the_same_document_cancellably(tmp_path):
    """Two stores on one data directory stand for two processes (the lock is a file lock)."""
    from store.datadir.locks import TurnCancelled

    first, second = Store(tmp_path), Store(tmp_path)
    try:
        doc = "ab" * 32
        with first.attach_turn(doc):
            with second.attach_turn("cd" * 32):  # another document: no wait
                pass
            stop, waited = threading.Event(), threading.Event()

            def cancel_once_waiting():
                waited.set()
                stop.set()

            with pytest.raises(TurnCancelled, match="another attach of the document"):
                with second.attach_turn(doc, cancel=stop, on_wait=cancel_once_waiting):
                    pass
            assert waited.is_set()
        with second.attach_turn(doc):  # released with the first's attach
            pass
    finally:
        first.close()
        second.close()
