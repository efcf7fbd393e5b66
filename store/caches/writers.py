"""Writing a KV entry: its chunks put one short write transaction at a time (store.caches.kv
says why), on the caller's thread or on one of their own, then made visible whole, or aborted
and deleted.

This module must never let a reader see an incomplete entry (`kv.complete` decides that), and
never leave an aborted one's chunks behind where a deletion can remove them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from ..datadir.db import Connections
from ..errors import NotFoundError
from ..records import Entry
from . import blobs
from .kv import complete, entry_spans, get_entry


class EntryWriter:
    """Writes one KV entry chunk by chunk; readers see it only once finish() has committed.

    Use as a context manager: leaving the block normally finishes the entry, an exception aborts
    it (its chunks are deleted). `spans` says which tokens each chunk index covers, `windows`
    which positions each part of the entry's window does (chunk indexes after the spans').
    """

    def __init__(
        self,
        db: Connections,
        entry_id: int,
        levels: tuple[str, ...],
        clock: Callable[[], float],
        on_finish: Callable[[Entry], list[dict]],
    ):
        self.entry_id = entry_id
        self.levels = levels
        self.entry: Entry | None = None
        self.finished = False
        self.evicted: list[dict] = []  # the caches finishing it evicted (gc's evicted_caches)
        self._db = db
        self._clock = clock
        self._on_finish = on_finish
        with db.read() as rdb:
            self.spans = entry_spans(rdb.conn, entry_id)
            self.windows = entry_spans(rdb.conn, entry_id, window=True)

    def put_chunk(self, chunk_index: int, level: str, data: bytes | memoryview) -> None:
        """Store the encoded bytes of one chunk (or window part) at one level (again: replaces
        them)."""
        n_chunks = len(self.spans) + len(self.windows)
        if not 0 <= chunk_index < n_chunks or level not in self.levels:
            raise ValueError(f"no chunk {chunk_index} at level {level!r} in this entry")
        with self._db.write() as wdb:
            conn = wdb.conn
            # Refreshing last_used doubles as the heartbeat that tells gc the writer is alive.
            alive = conn.execute(
                "UPDATE kv_entries SET last_used = ? WHERE id = ? AND NOT complete",
                (self._clock(), self.entry_id),
            ).rowcount
            if not alive:
                raise NotFoundError(f"KV entry {self.entry_id} was removed while being written")
            blobs.put(conn, self.entry_id, chunk_index, level, data)

    def finish(self) -> Entry:
        """Make the entry visible (or adopt an identical one stored meanwhile) and return it.
        Written not to evict (`Store.write_entry`), one that does not fit the storage budget
        is removed again: BudgetFullError."""
        with self._db.write() as wdb:
            entry_id = complete(wdb.conn, self.entry_id, self._clock())
            self.entry = get_entry(wdb.conn, entry_id)
        self.finished = True
        self.evicted = self._on_finish(self.entry)
        return self.entry

    def abort(self) -> None:
        """Delete what was written of the entry: a deletion, which on a full disk (where a
        write failing most often leaves it) the reserve pays for, as `rm` and `gc`."""
        def work() -> None:
            with self._db.write() as wdb:
                wdb.conn.execute(
                    "DELETE FROM kv_entries WHERE id = ? AND NOT complete", (self.entry_id,))
        self._db.freeing(work)

    def __enter__(self) -> EntryWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self.finished:
            self.finish()


class BackgroundWriter:
    """Puts an EntryWriter's chunks on a thread of its own, in the order given.

    Encoding (CPU) or fetching (network) then never waits on a durable write (mostly fsync).
    The first failure stops the writing; `put` raises it on the caller's thread, and so does
    `close(raise_failure=True)`, which waits for every chunk put before it.
    """

    def __init__(self, writer: EntryWriter, maxsize: int = 0):
        self.failure: BaseException | None = None
        self._writer = writer
        self._queue: queue.Queue = queue.Queue(maxsize)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kv-writer", daemon=True)
        self._thread.start()

    def put(self, chunk_index: int, level: str, data: bytes | memoryview) -> None:
        if self.failure is not None:
            raise self.failure
        self._queue.put((chunk_index, level, data))

    def close(self, *, raise_failure: bool = True) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()
        if raise_failure and self.failure is not None:
            raise self.failure

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self.failure is None:
                try:
                    self._writer.put_chunk(*item)
                except BaseException as e:  # handed to the caller's thread
                    self.failure = e
