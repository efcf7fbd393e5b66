"""Locks between processes that share a data directory: one turn at a time per chat, one
attach at a time per document, one calibration at a time per model.

A turn reads the conversation, answers and stores both messages (and the chat's KV). Two
kvdesk processes asking in the same chat at once (two terminals, the CLI beside the GUI)
would otherwise both answer from the conversation as it was before either turn, while the
history shows them in sequence. `ChatLocks.turn` holds a file lock (filelock: fcntl or
msvcrt) in the data directory's `locks/` folder for the whole turn, so the second waits and
then answers with the first turn in its context. Within one process the lock is re-entrant
per thread. `ChatLocks.attach` does the same for the attaches of one document (by content
hash): the second waits, then takes the first one's result (or, if it was killed, finishes
its work). `ChatLocks.calibration` keeps two processes (the window and `kvdesk serve`,
each calibrating a new model by itself) from measuring the same model at once. A lock dies
with its process, so a killed holder never blocks anyone.

Lock files are tiny and kept (removing one another process may be waiting on would let two
processes hold "the" lock at once). Nothing here reads or writes the database.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import filelock

from ..errors import StoreError
from .readonly import read_only_cause, read_only_error

POLL_S = 0.1  # how often a waiting turn checks whether it was cancelled


class TurnCancelled(StoreError):
    """The caller stopped waiting for another process: its turn in the same chat, or its
    attach of the same document."""


class ChatLocks:
    def __init__(self, folder: Path):
        self.folder = folder
        self._locks: dict[str, filelock.FileLock] = {}
        self._guard = threading.Lock()

    def turn(self, chat_id: int, *, cancel: threading.Event | None = None,
             on_wait: Callable[[], None] | None = None
             ) -> contextlib.AbstractContextManager[None]:
        """Hold chat `chat_id`'s turn; `on_wait` is called once if another process has it."""
        return self._hold(f"chat-{chat_id}", f"chat {chat_id}'s turn", cancel, on_wait)

    def attach(self, content_hash: str, *, cancel: threading.Event | None = None,
               on_wait: Callable[[], None] | None = None
               ) -> contextlib.AbstractContextManager[None]:
        """Hold the attach of the document with this content hash (as `turn`)."""
        return self._hold(f"attach-{content_hash[:32]}", "another attach of the document",
                          cancel, on_wait)

    def calibration(self, fingerprint: str, *, cancel: threading.Event | None = None,
                    on_wait: Callable[[], None] | None = None
                    ) -> contextlib.AbstractContextManager[None]:
        """Hold the calibration of the model with this fingerprint (as `turn`)."""
        return self._hold(f"calibrate-{fingerprint[:32]}", "another calibration of the model",
                          cancel, on_wait)

    @contextlib.contextmanager
    def _hold(self, name: str, what: str, cancel: threading.Event | None,
              on_wait: Callable[[], None] | None) -> Iterator[None]:
        waited = False
        while True:
            try:
                # (filelock opens the file for writing at every acquire, even one that exists)
                self._lock(name).acquire(timeout=0 if not waited else POLL_S)
                break
            except filelock.Timeout:
                if cancel is not None and cancel.is_set():
                    raise TurnCancelled(f"stopped waiting for {what}") from None
                if not waited and on_wait is not None:
                    on_wait()
                waited = True
            except OSError as e:
                # A file system turned read-only (EROFS) is the store's read-only state, not
                # a failure of kvdesk's own
                if not read_only_cause(e, self.folder.parent):
                    raise
                raise read_only_error(self.folder.parent) from None
        try:
            yield
        finally:
            self._lock(name).release()

    def _lock(self, name: str) -> filelock.FileLock:
        with self._guard:
            if name not in self._locks:
                self.folder.mkdir(exist_ok=True)
                self._locks[name] = filelock.FileLock(self.folder / f"{name}.lock")
            return self._locks[name]
