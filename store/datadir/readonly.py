"""A data directory whose file system turned read-only while it stays mounted "rw": a drive
the kernel switched to read-only after an error (ext4's errors=remount-ro, shown as
`emergency_ro`), the way a failing USB stick goes. os.access() and statvfs() still say
writable there; every open for writing fails with EROFS (reading works).

This module recognizes that state (`turned_read_only`, `read_only_cause`) and says what it
means (`read_only_error`), for `Connections` and the lock files to raise the same
ReadOnlyError a read-only mount gives. It must never write, create or remove anything: its
probe opens the store's empty mark file for writing and closes it, writing nothing. It must
never open the database file: closing any descriptor of it drops every POSIX lock SQLite
holds on it in this process.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from ..errors import ReadOnlyError

# The empty file a store leaves beside its database once made (store.datadir.db.made_mark)
MARK = ".kvdesk-store-made"


def turned_read_only(data_dir: Path) -> bool:
    """Whether the file system of the data directory refuses writes (EROFS), probed on the
    store's mark file. A mark that is not there, or any other error, says nothing: False
    (the write says what it meets)."""
    try:
        fd = os.open(data_dir / MARK, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        return e.errno == errno.EROFS
    os.close(fd)
    return False


def read_only_cause(error: BaseException, data_dir: Path) -> bool:
    """Whether `error` (an OSError, or SQLite's) came of a file system that refuses writes
    in `data_dir`: EROFS, SQLite's "readonly" codes, or its "disk I/O error" where the file
    system now refuses writes."""
    if isinstance(error, OSError):
        return error.errno == errno.EROFS
    if not isinstance(error, sqlite3.DatabaseError):
        return False
    code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
    if code == sqlite3.SQLITE_READONLY:
        return True
    return code in (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN) and turned_read_only(data_dir)


def read_only_error(data_dir: Path) -> ReadOnlyError:
    """What a read-only data directory means for the user: one whose file system went
    read-only while mounted for writing (`turned_read_only`) is said to be so."""
    why = (" (its file system turned read-only, as a system does with a drive after an error: "
           "check the drive, then mount it again)") if _turned(data_dir) else ""
    return ReadOnlyError(f"the data directory {data_dir} is read-only{why}: kvdesk can list "
                         "and verify what it holds, not change it")


def _turned(data_dir: Path) -> bool:
    """Whether the folder is mounted for writing and may be written by this user, yet
    refuses writes."""
    try:
        mounted_rw = not os.statvfs(data_dir).f_flag & os.ST_RDONLY
    except OSError:
        return False
    return (mounted_rw and os.access(data_dir, os.W_OK)
            and turned_read_only(data_dir))
