"""SQLite connections for the store: one per thread, WAL, IMMEDIATE write transactions.

The GUI thread, background workers and other processes share one database file. WAL lets readers
run while one writer commits; every write starts with BEGIN IMMEDIATE so it waits (busy_timeout)
for the write lock up front instead of failing with "database is locked" when a read transaction
tries to upgrade. This module must never hand a connection to another thread, and never leave a
transaction open when a call returns.

A damaged file (a rotten page) is found by SQLite's own check when the store opens
(`Connections.check`) or by the first statement that meets it, which raises DamagedError, never
a raw sqlite3 error; from then on nothing is written to the file (`Connections.damage`); so
does a stored JSON value that no longer decodes (store.datadir.values). A full disk raises
DiskFullError, its transaction rolled back whole.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import sqlite_utils

from ..errors import DamagedError, DataDirError, ReadOnlyError
from ..words import FTS_HEADINGS, FTS_TEXT, index_headings, index_text
from .filesize import too_large
from .full import disk_full, disk_is_full, is_full
from .paying import INCREMENTAL, Paying
from .place import Place
from .readonly import MARK, read_only_cause, read_only_error, turned_read_only
from .reserve import NAME as RESERVE_NAME
from .reserve import WORDS_NAME, Reserve, WordsReserve

# Long enough to outlast any single write the store makes (the largest is one chunk of ~6 MB, or
# one eviction), short enough that a wedged process surfaces as an error instead of a hang.
BUSY_TIMEOUT_MS = 60_000

# Reads go through mmap up to this size: incremental blob reads of multi-MB chunks then copy
# straight from the page cache instead of one pread() per 4 KiB page (+50% throughput, see
# store.caches.blobs). SQLite clamps it to its compile-time maximum (2 GiB in common builds);
# pages past that are read with pread(), still above 1 GB/s.
MMAP_SIZE = 1 << 36


def is_damage(error: sqlite3.DatabaseError) -> bool:
    """Whether SQLite raised this because the file is damaged (a malformed page, a full-text
    index whose own tables are), not for a statement or a lock."""
    code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
    # "malformed JSON": SQLite's JSON functions over a stored value (the store hands them
    # none of its own), one rotten inside its text
    return code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB) or any(
        why in str(error) for why in ("vtable constructor failed", "malformed JSON"))


def _translating(name: str):
    """sqlite3.Cursor's method `name`, its damage errors made DamagedError and a full disk
    DiskFullError (`_Cursor`)."""
    method = getattr(sqlite3.Cursor, name)

    def call(self, *args):
        try:
            return method(self, *args)
        except sqlite3.DatabaseError as e:
            if is_full(e):
                raise disk_full(self.connection.path) from e
            if (limit := too_large(e, self.connection.path)) is not None:  # (FAT32's 4 GB)
                raise limit from e
            owner = getattr(self.connection, "owner", None)
            if owner is not None and not owner.cannot_write and read_only_cause(
                    e, self.connection.path.parent):
                raise owner.went_read_only() from e
            if owner is None or not is_damage(e):
                raise
            raise owner.found_damage(str(e)) from e

    return call


class _Cursor(sqlite3.Cursor):
    """A cursor whose damage errors become DamagedError, marking its store damaged, and a
    full disk DiskFullError."""

    execute = _translating("execute")
    executemany = _translating("executemany")
    executescript = _translating("executescript")
    __next__ = _translating("__next__")
    fetchone = _translating("fetchone")
    fetchmany = _translating("fetchmany")
    fetchall = _translating("fetchall")


class _Connection(sqlite3.Connection):
    """Every statement through a `_Cursor` (sqlite3's own `execute` would bypass it)."""

    owner: Connections | None = None
    path: Path = Path("store.db")  # the database file's (open_connection sets it)

    def cursor(self, factory=None):
        return super().cursor(factory or _Cursor)

    def execute(self, sql, parameters=(), /):
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql, parameters, /):
        return self.cursor().executemany(sql, parameters)

    def executescript(self, script, /):
        return self.cursor().executescript(script)


def execute_script(conn: sqlite3.Connection, script: str) -> None:
    """Run each statement of an SQL script inside the caller's transaction (executescript
    would commit it first): split on the semicolons that end one (a trigger's body holds
    statements of its own, closed by END;; none inside comments or strings)."""
    current: list[str] = []
    for part in script.split(";"):
        current.append(part)
        text = ";".join(current)
        if re.search(r"\bBEGIN\b", text, re.I) and not text.rstrip().upper().endswith("END"):
            continue
        if text.strip():
            conn.execute(text)
        current = []


def open_connection(path: Path, *, read_only: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit) with the store's pragmas.

    read_only: for a data directory nobody can write to (a read-only mount, another user's
    files); nothing is written, not even a journal or SQLite's shared-memory file. A database
    whose write-ahead log holds commits (a copy taken while kvdesk ran, another user's store in
    use) is read through the log and its shared-memory file, which must then exist (mode=ro);
    any other is opened immutable, as SQLite otherwise creates the shared-memory file beside it.
    """
    conn = _open(path, read_only)
    # The passages' full-text index reads its text through it (store.words), in its
    # triggers too: any connection that adds or deletes a passage needs it.
    conn.create_function(FTS_TEXT, 1, index_text, deterministic=True)
    conn.create_function(FTS_HEADINGS, 1, index_headings, deterministic=True)
    return conn


def _open(path: Path, read_only: bool) -> sqlite3.Connection:
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
                               timeout=BUSY_TIMEOUT_MS / 1000, factory=_Connection)
        conn.path = path
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA mmap_size = {MMAP_SIZE}")
        return conn
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000,
        factory=_Connection)
    conn.path = path
    # (closed where a pragma fails: a file system without what WAL needs; its files, left
    # open, could not be removed)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # Freed pages are not overwritten with zeros (SQLite's FAST: only where it costs no I/O;
        # some builds default to ON): evicting or deleting a cache would otherwise write as much
        # as it frees, and on a full disk `rm` and `gc` could not free anything.
        conn.execute("PRAGMA secure_delete = FAST")
        # Lets gc() hand freed chunk pages back to the file system (PRAGMA incremental_vacuum).
        # Set on a new, empty database only, where it takes effect: on another it would still
        # write the file's header, and fail on a full disk where reading works.
        if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
            conn.execute(f"PRAGMA auto_vacuum = {INCREMENTAL}")
        conn.execute("PRAGMA journal_mode = WAL")
        # FULL: a commit survives power loss, not only a process crash; documents and chats are user
        # data, and commits are few (one per chunk or message), so the fsync cost is small.
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA mmap_size = {MMAP_SIZE}")
    except BaseException:
        conn.close()
        raise
    return conn


class Connections(Paying):
    """Hands each thread its own connection to one database file, and closes them all at the end.

    Connections come wrapped in a sqlite_utils.Database; its table helpers nest inside the
    transactions opened here (as savepoints), so a read or write block stays one transaction.
    """

    def __init__(self, path: Path, *, read_only: bool = False):
        self.path = path
        self.cannot_write = read_only
        # Opened read-only on a disk full to the last byte with no reserve left to give back
        # (`opened`): reading needs no room; every write says the disk is full.
        self.full = False
        self.damage: str | None = None  # what SQLite found damaged, once it has
        # Called once, with the error, when damage is first found (the app warns of it)
        self.on_damage: Callable[[DamagedError], None] | None = None
        self.reserve = Reserve(path.parent)  # for freeing space
        self.words = WordsReserve(path.parent)  # for a turn's text
        self.place = Place(path)  # the file opened: writes stop if it is removed or moved
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: dict[threading.Thread, sqlite3.Connection] = {}

    @property
    def read_only(self) -> bool:
        return self.cannot_write or self.full or self.damage is not None

    def found_damage(self, why: str) -> DamagedError:
        """Mark the file damaged (nothing is written to it any more); the error to raise."""
        first, self.damage = self.damage is None, self.damage or why
        if first and self.on_damage is not None:
            self.on_damage(self.damaged_error())
        return self.damaged_error()

    def damaged_error(self) -> DamagedError:
        """What the damage found (`damage`) means for the user, and what to do."""
        return DamagedError(
            f"the store {self.path} is damaged ({self.damage}): kvdesk reads what it still can "
            "and writes nothing more to it. `kvdesk verify` says where; `kvdesk export` saves a "
            "chat while it can be read; to start afresh, move the file out of the data "
            "directory (or put back a backup of it)")

    def check(self) -> None:
        """SQLite's own check of every table but the chunks' bytes (milliseconds: `verify`
        checks those); damage found marks the file damaged."""
        if _made_here(self.path) and _cut_to_nothing(self.path):
            # SQLite reads an empty file as a new, empty database: every chat and document
            # would vanish without a word. A store is never empty once made (its schema
            # commits before its marks are left), so a disk or a copy cut this one short.
            raise sqlite3.DatabaseError("it is empty: 0 bytes, though this folder held a store")
        conn = self.get().conn
        tables = [t for (t,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'kv_chunks'")]
        for table in tables:
            problems = quick_check(conn, table)
            if problems:
                self.found_damage(f"table {table}: {problems[0]}")
                return

    def opened(self, prepare: Callable[[sqlite3.Connection], None]) -> None:
        """Check the file (`check`) and `prepare` it (migrate it, or check a read-only one's
        schema), then take the reserve while there is room. On a disk full to the last byte
        SQLite cannot grow its shared-memory file: the reserve is given back, and it tries
        again, taking back after what opening did not use (an attach that follows meets the
        full disk, not the reserve's room); with none left (the disk filled again since), the
        file is opened read-only (`full`), as a read-only directory's is, so that reading
        still works there."""
        for _ in range(3):
            try:
                self.check()  # a damaged file is read, never written (`damage`)
                prepare(self.get().conn)
                break
            except (sqlite3.OperationalError, DataDirError) as e:
                if self.full:  # not even read-only (a log to read through, an upgrade due)
                    raise disk_full(self.path) from e
                if isinstance(e, DataDirError) or "disk I/O" not in str(e) or not disk_is_full(
                        self.path):
                    raise
                self.close()
                self.full = not self.reserve.release()
        self.place.fix()
        if not self.read_only:
            with contextlib.suppress(OSError):  # (an empty file: a full disk makes it too)
                made_mark(self.path).touch()
            self.retake()

    def get(self) -> sqlite_utils.Database:
        db = getattr(self._local, "db", None)
        if db is None:
            self.place.check(reading=True)  # (SQLite would create the file anew, or fail to)
            conn = open_connection(self.path, read_only=self.cannot_write or self.full)
            conn.owner = self
            with self._lock:
                # Workers come and go; close what finished threads left behind, so a long session
                # does not accumulate file handles.
                for thread in [thread for thread in self._open if not thread.is_alive()]:
                    self._open.pop(thread).close()
                self._open[threading.current_thread()] = conn
            db = self._local.db = sqlite_utils.Database(conn, execute_plugins=False)
        return db

    def went_read_only(self) -> ReadOnlyError:
        """Mark the file read-only from now on, its file system having turned so (EROFS); the
        error to raise."""
        self.cannot_write = True
        return read_only_error(self.path.parent)

    def check_writable(self) -> None:
        """Raise what a write would (DamagedError, DiskFullError, ReadOnlyError), without
        writing."""
        self.place.check()
        if self.damage is not None:
            raise self.damaged_error()
        if self.full and not self.cannot_write:
            raise disk_full(self.path)
        if not self.read_only and turned_read_only(self.path.parent):  # (microseconds)
            raise self.went_read_only()
        if self.read_only:
            raise read_only_error(self.path.parent)

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite_utils.Database]:
        """A write transaction: takes the write lock first, commits on success, else rolls back."""
        self.check_writable()
        db = self.get()
        db.conn.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.conn.execute("COMMIT")
        except BaseException:
            # SQLite has rolled back already after some errors (a full disk): ROLLBACK would
            # raise over the error that says why
            if db.conn.in_transaction:
                db.conn.execute("ROLLBACK")
            raise

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


def quick_check(conn: sqlite3.Connection, table: str | None = None) -> list[str]:
    """What SQLite's quick_check finds wrong in the file (or in one table and its indexes);
    empty where nothing is."""
    pragma = "PRAGMA quick_check" + (f'("{table}")' if table else "")
    try:
        lines = [line for (row,) in conn.execute(pragma) for line in row.splitlines()]
    except DamagedError as e:  # too damaged to check whole: each table alone says where
        try:
            tables = [] if table else [t for (t,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
        except DamagedError:  # (the schema's own page)
            tables = []
        return [f"table {t}: {found[0]}" for t in tables
                if (found := quick_check(conn, t))] or [str(e.__cause__)]
    lines = [x for x in lines if x not in ("ok", "*** in database main ***")]
    return lines


def made_mark(path: Path) -> Path:
    """An empty file beside the database, left once its schema is committed: a store was
    made here (the reserves say so too, but a disk without room for them has none)."""
    return path.with_name(MARK)


def _made_here(path: Path) -> bool:
    return any(p.exists() for p in (made_mark(path), path.with_name(RESERVE_NAME),
                                    path.with_name(WORDS_NAME)))


def _cut_to_nothing(path: Path) -> bool:
    """Whether the database file is empty, its write-ahead log (where a copy taken while a
    writer ran can hold everything) too."""
    def size(p: Path) -> int:
        try:
            return p.stat().st_size
        except OSError:
            return 0
    return path.exists() and size(path) == 0 and size(path.with_name(path.name + "-wal")) == 0


def prepare_data_dir(data_dir: Path, path: Path) -> bool:
    """Create the data directory if needed; whether it can only be read (DataDirError if it
    cannot be used at all)."""
    try:
        # (its documents' text, chats and caches are this user's alone: a folder made here
        # is closed to other users, whatever the umask; one that exists is left as it is)
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
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
        not path.exists() or os.access(path, os.W_OK) and not turned_read_only(data_dir))
    if not writable and not path.exists():
        raise DataDirError(f"the data directory {data_dir} is read-only and holds no kvdesk "
                           "data yet")
    return not writable
