"""A backup of a data directory's store: one consistent copy of its database, made while
other kvdesk processes read and write it.

`backup` writes DEST/kvdesk.sqlite: the whole file through SQLite's online backup API, or,
without the caches (`caches=False`), a new file with the same schema holding every table's rows
but the KV caches' (computed again when used). Either is read inside one read transaction of
the source, so the copy holds every commit made before it began and none after; WAL lets
writers go on meanwhile. The copy is written under a temporary name, checked by SQLite
(quick_check) and renamed at the end; a failure or a stop (`cancel`) removes what it wrote.

It must never write to the source store, nor leave a partial copy under the store's name.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .datadir.db import is_damage, made_mark, open_connection, quick_check
from .datadir.full import is_full
from .errors import BackupError, StoppedError
from .store import DB_NAME

# Computed again when used: a copy without them keeps every document, chat and message.
CACHE_TABLES = ("kv_entries", "kv_spans", "kv_chunks", "kv_entry_documents")
PARTIAL = DB_NAME + ".partial"
# Pages per step of the online backup (4 MiB of 4 KiB pages): progress and Ctrl-C between them
STEP_PAGES = 1024
ROWS = 1000  # rows per insert batch of a copy without caches: Ctrl-C between them

Progress = Callable[[int, int], None]  # (done, total): pages, or tables without caches


def backup(data_dir: Path, dest: Path, *, caches: bool = True, progress: Progress | None = None,
           cancel: threading.Event | None = None) -> dict:
    """Copy the store of `data_dir` to `dest`/kvdesk.sqlite (a new or empty folder, outside
    the data directory); what was copied. A damaged store is copied whole as it is, its damage
    too (`damage` in the answer lists what SQLite finds): the copy a user keeps before
    repairing; without caches it is refused, as its rows may not read."""
    source = Path(data_dir) / DB_NAME
    dest = Path(dest)
    _check_source(source)
    made = _make_dest(Path(data_dir), dest)
    partial = dest / PARTIAL
    began = time.monotonic()
    try:
        conn = _open_source(source)
        try:
            conn.execute("BEGIN")  # one snapshot for every step and table (see `_whole`)
            counts = _counts(conn)
            if caches:
                _whole(conn, partial, progress, cancel)
            else:
                _without_caches(conn, partial, progress, cancel)
            # (it only read; COMMIT would raise again what a damaged page raised in it)
            conn.execute("ROLLBACK")
            damage = _checked(partial, conn)
        finally:
            conn.close()
        os.replace(partial, dest / DB_NAME)
        made_mark(dest / DB_NAME).touch()
    except BaseException as e:
        _remove(dest, made)
        if isinstance(e, sqlite3.DatabaseError) and is_full(e):
            raise BackupError(f"the disk holding {dest} is full: the backup needs about "
                              f"{_size(source) / 1e6:,.0f} MB there (less without its "
                              "caches); nothing was left in it") from e
        if isinstance(e, sqlite3.DatabaseError) and is_damage(e) and not caches:
            raise BackupError(f"the store {source} is damaged ({e}): a copy without its caches "
                              "cannot read it; `kvdesk backup` with them copies the file whole, "
                              "as it is (its damage too)") from e
        if isinstance(e, sqlite3.DatabaseError):
            raise BackupError(f"the backup to {dest} failed ({e}); nothing was left in "
                              "it") from e
        if isinstance(e, OSError):
            raise BackupError(f"the backup to {dest} failed ({e.strerror or e}); nothing was "
                              "left in it") from e
        raise
    return {**counts, "dest": str(dest), "file": str(dest / DB_NAME), "caches": caches,
            "bytes": _size(dest / DB_NAME), "source_bytes": _size(source),
            "seconds": round(time.monotonic() - began, 3), "damage": damage}


def _check_source(source: Path) -> None:
    if not source.is_file() or _size(source) == 0:
        raise BackupError(f"no kvdesk store in {source.parent}: nothing to back up")


def _make_dest(data_dir: Path, dest: Path) -> bool:
    """Create `dest` (whether it was made here); refuse one that holds anything or lies
    inside the data directory (a backup there would go where it protects nothing)."""
    where, home = dest.resolve(), data_dir.resolve()
    if where == home or home in where.parents:
        raise BackupError(f"{dest} is inside the data directory {data_dir}: choose a folder "
                          "outside it (another disk is best)")
    if dest.exists() and not dest.is_dir():
        raise BackupError(f"{dest} is a file: name a new or empty folder")
    try:
        if dest.is_dir():
            if any(dest.iterdir()):
                raise BackupError(f"{dest} is not empty: name a new or empty folder (a backup "
                                  "never writes over anything)")
            return False
        dest.mkdir(mode=0o700, parents=True)  # (as the data folder: this user's alone)
    except OSError as e:
        raise BackupError(f"{dest} cannot be used for a backup: {e.strerror or e}") from None
    return True


def _open_source(source: Path) -> sqlite3.Connection:
    """The store's own connection, read-only where its folder cannot be written (the backup
    writes nothing to it either way)."""
    writable = os.access(source.parent, os.W_OK | os.X_OK) and os.access(source, os.W_OK)
    return open_connection(source, read_only=not writable)


def _counts(conn: sqlite3.Connection) -> dict[str, int | None]:
    """How many documents, chats and messages are copied (None: a damaged table's, which
    cannot be counted)."""
    tables = {t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    counts: dict[str, int | None] = {}
    for name in ("documents", "chats", "messages"):
        try:
            counts[name] = conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] \
                if name in tables else 0
        except sqlite3.DatabaseError as e:
            if not is_damage(e):
                raise
            counts[name] = None
    return counts


def _whole(conn: sqlite3.Connection, partial: Path, progress: Progress | None,
           cancel: threading.Event | None) -> None:
    """The whole file, page by page. The caller's open read transaction keeps every step on
    one snapshot: without it each commit of another process restarts the copy from its first
    page, and a store written to steadily (a server answering) is never copied."""
    def step(status: int, remaining: int, total: int) -> None:
        if cancel is not None and cancel.is_set():
            raise StoppedError
        if progress is not None:
            progress(total - remaining, total)

    target = sqlite3.connect(partial)
    try:
        conn.backup(target, pages=STEP_PAGES, progress=step)
    finally:
        target.close()


def _without_caches(conn: sqlite3.Connection, partial: Path, progress: Progress | None,
                    cancel: threading.Event | None) -> None:
    """A new file given the source's schema (its own statements, in its order), every table's
    rows but the caches', the full-text index's own tables copied as they are; triggers last,
    so that copying fires none."""
    schema = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"
                          " WHERE sql IS NOT NULL ORDER BY rowid").fetchall()
    virtual = [name for kind, name, _, sql in schema
               if kind == "table" and sql.upper().startswith("CREATE VIRTUAL TABLE")]
    # (made by their virtual table's statement, as sqlite_sequence is by AUTOINCREMENT's)
    shadows = {name for kind, name, _, _ in schema if kind == "table" and any(
        name.startswith(v + "_") for v in virtual)}
    tables = [name for kind, name, _, _ in schema if kind == "table" and name not in
              (*virtual, *CACHE_TABLES) and not name.startswith("sqlite_")]
    target = sqlite3.connect(partial, isolation_level=None)
    try:
        target.execute(f"PRAGMA auto_vacuum = {conn.execute('PRAGMA auto_vacuum').fetchone()[0]}")
        target.execute("BEGIN")
        for kind, name, _, sql in schema:
            if kind != "trigger" and name not in shadows and not name.startswith("sqlite_"):
                target.execute(sql)
        copied = [*tables, *(["sqlite_sequence"] if any(
            name == "sqlite_sequence" for _, name, _, _ in schema) else [])]
        for done, table in enumerate(copied):
            if progress is not None:
                progress(done, len(copied))
            # (rows their statement, or the rows copied before, wrote: a config row, a root,
            # the last ids so far)
            if table in shadows or table == "sqlite_sequence":
                target.execute(f'DELETE FROM "{table}"')
            _rows(conn, target, table, cancel)
        for kind, _, _, sql in schema:
            if kind == "trigger":
                target.execute(sql)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        target.execute(f"PRAGMA user_version = {int(version)}")
        target.execute("COMMIT")
        target.execute("PRAGMA journal_mode = WAL")  # (as the store's own file is)
        if progress is not None:
            progress(len(copied), len(copied))
        _same_schema(conn, target)
    finally:
        target.close()


def _rows(conn: sqlite3.Connection, target: sqlite3.Connection, table: str,
          cancel: threading.Event | None) -> None:
    rows = conn.execute(f'SELECT * FROM "{table}"')
    marks = ", ".join("?" * len(rows.description))
    while batch := rows.fetchmany(ROWS):
        if cancel is not None and cancel.is_set():
            raise StoppedError
        target.executemany(f'INSERT INTO "{table}" VALUES ({marks})', batch)


def _same_schema(conn: sqlite3.Connection, target: sqlite3.Connection) -> None:
    """Refuse a copy whose schema differs from its source's in any table, index, view or
    trigger (a copy that kvdesk would open as another version's store)."""
    query = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
    if conn.execute(query).fetchall() != target.execute(query).fetchall():
        raise BackupError("the copy's schema differs from the store's (a bug of kvdesk's "
                          "backup): nothing was left; `kvdesk backup` with its caches copies "
                          "the file whole")


def _checked(partial: Path, conn: sqlite3.Connection) -> list[str]:
    """SQLite's quick_check of the copy: nothing found, or the damage the source holds too
    (copied as it is); damage of the copy's own is an error."""
    copy = sqlite3.connect(partial)
    try:
        found = _problems(copy)
    finally:
        copy.close()
    if found and not _problems(conn):
        raise BackupError(f"the copy does not pass SQLite's check ({found[0]}), though the "
                          "store does: nothing was left (is the disk of the backup failing?)")
    return found


def _problems(conn: sqlite3.Connection) -> list[str]:
    try:
        return quick_check(conn)
    except sqlite3.DatabaseError as e:  # (too damaged to be checked at all)
        return [str(e)]


def _remove(dest: Path, made: bool) -> None:
    """Remove what a failed or stopped backup wrote: its file, and the folder it made."""
    for name in (PARTIAL, PARTIAL + "-wal", PARTIAL + "-shm", PARTIAL + "-journal", DB_NAME,
                 made_mark(dest / DB_NAME).name):
        with contextlib.suppress(OSError):
            (dest / name).unlink()
    if made:
        with contextlib.suppress(OSError):
            dest.rmdir()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
