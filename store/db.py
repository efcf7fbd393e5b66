"""SQLite connections for the store: one per thread, WAL, IMMEDIATE write transactions.

The GUI thread, background workers and other processes share one database file. WAL lets readers
run while one writer commits; every write starts with BEGIN IMMEDIATE so it waits (busy_timeout)
for the write lock up front instead of failing with "database is locked" when a read transaction
tries to upgrade. This module must never hand a connection to another thread, and never leave a
transaction open when a call returns.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import sqlite_utils

from .errors import DataDirError, ReadOnlyError

# Long enough to outlast any single write the store makes (the largest is one chunk of ~6 MB, or
# one eviction), short enough that a wedged process surfaces as an error instead of a hang.
BUSY_TIMEOUT_MS = 60_000

# Reads go through mmap up to this size: incremental blob reads of multi-MB chunks then copy
# straight from the page cache instead of one pread() per 4 KiB page (+50% throughput, see
# store.blobs). SQLite clamps it to its compile-time maximum (2 GiB in common builds); pages past
# that are read with pread(), still above 1 GB/s.
MMAP_SIZE = 1 << 36


def open_connection(path: Path, *, read_only: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit) with the store's pragmas.

    read_only: for a data directory nobody can write to (a read-only mount, another user's
    files); nothing is written, not even a journal or SQLite's shared-memory file. A database
    whose write-ahead log holds commits (a copy taken while kvdesk ran, another user's store in
    use) is read through the log and its shared-memory file, which must then exist (mode=ro);
    any other is opened immutable, as SQLite otherwise creates the shared-memory file beside it.
    """
    if read_only:
        wal = path.with_name(path.name + "-wal")
        in_log = wal.exists() and wal.stat().st_size > 0
        if in_log and not path.with_name(path.name + "-shm").exists():
            raise DataDirError(
                f"the data directory {path.parent} is read-only and its store has changes "
                f"still in {wal.name} that cannot be read without writing beside it: open "
                "it once where it can be written")
        mode = "mode=ro" if in_log else "immutable=1"
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True,
                               isolation_level=None, check_same_thread=False,
                               timeout=BUSY_TIMEOUT_MS / 1000)
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA mmap_size = {MMAP_SIZE}")
        return conn
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
    )
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    # Only takes effect on a new, empty database (before the first table); lets gc() hand freed
    # chunk pages back to the file system with PRAGMA incremental_vacuum.
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    conn.execute("PRAGMA journal_mode = WAL")
    # FULL: a commit survives power loss, not only a process crash; documents and chats are user
    # data, and commits are few (one per chunk or message), so the fsync cost is small.
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(f"PRAGMA mmap_size = {MMAP_SIZE}")
    return conn


class Connections:
    """Hands each thread its own connection to one database file, and closes them all at the end.

    Connections come wrapped in a sqlite_utils.Database; its table helpers nest inside the
    transactions opened here (as savepoints), so a read or write block stays one transaction.
    """

    def __init__(self, path: Path, *, read_only: bool = False):
        self.path = path
        self.read_only = read_only
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: dict[threading.Thread, sqlite3.Connection] = {}

    def get(self) -> sqlite_utils.Database:
        db = getattr(self._local, "db", None)
        if db is None:
            conn = open_connection(self.path, read_only=self.read_only)
            with self._lock:
                # Workers come and go; close what finished threads left behind, so a long session
                # does not accumulate file handles.
                for thread in [thread for thread in self._open if not thread.is_alive()]:
                    self._open.pop(thread).close()
                self._open[threading.current_thread()] = conn
            db = self._local.db = sqlite_utils.Database(conn, execute_plugins=False)
        return db

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite_utils.Database]:
        """A write transaction: takes the write lock first, commits on success, else rolls back."""
        if self.read_only:
            raise ReadOnlyError(f"the data directory {self.path.parent} is read-only: kvdesk "
                                "can list and verify what it holds, not change it")
        db = self.get()
        db.conn.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.conn.execute("ROLLBACK")
            raise
        db.conn.execute("COMMIT")

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite_utils.Database]:
        """A read transaction: every statement inside sees the same committed snapshot."""
        db = self.get()
        db.conn.execute("BEGIN")
        try:
            yield db
        finally:
            db.conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            for conn in self._open.values():
                conn.close()
            self._open.clear()
        self._local = threading.local()


def prepare_data_dir(data_dir: Path, path: Path) -> bool:
    """Create the data directory if needed; whether it can only be read (DataDirError if it
    cannot be used at all)."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        what = "a link that leads to no folder" if data_dir.is_symlink() else "a file"
        raise DataDirError(f"the data directory {data_dir} is {what}, not a folder: choose "
                           "another (--data-dir, KVDESK_DATA_DIR or Settings)") from None
    except NotADirectoryError:
        raise DataDirError(f"the data directory {data_dir} cannot be created: part of its "
                           "path is a file") from None
    except PermissionError:
        raise DataDirError(f"the data directory {data_dir} cannot be created: permission "
                           "denied") from None
    except OSError as e:  # a read-only or virtual file system, a name too long, a link loop
        raise DataDirError(f"the data directory {data_dir} cannot be created: "
                           f"{e.strerror or e}") from None
    if not data_dir.is_dir():
        raise DataDirError(f"the data directory {data_dir} is not a folder")
    writable = os.access(data_dir, os.W_OK | os.X_OK) and (
        not path.exists() or os.access(path, os.W_OK))
    if not writable and not path.exists():
        raise DataDirError(f"the data directory {data_dir} is read-only and holds no kvdesk "
                           "data yet")
    return not writable
