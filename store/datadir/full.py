"""What a full disk means for the store: SQLite's "full" recognized, and the error the user
reads, naming the data directory, the room left and the way out (with the reserve kept for a
full disk, store.datadir.reserve, or without it).

This module only reads the disk's free space and the reserve's size: it never writes, and
never touches the database.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from ..errors import DiskFullError
from .reserve import held


def is_full(error: sqlite3.DatabaseError) -> bool:
    """Whether SQLite raised this because the disk (or the file's page limit) is full."""
    return (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF == sqlite3.SQLITE_FULL


def disk_is_full(path: Path) -> bool:
    """Whether the disk under the store `path` has (almost) no room left."""
    try:
        return shutil.disk_usage(path.parent).free < 1 << 20
    except OSError:
        return False


def disk_full(path: Path) -> DiskFullError:
    """What a full disk under the store `path` means for the user, and what to do."""
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    if free is not None and free > 64 << 20:  # not this disk: SQLite's temporary files' one
        return DiskFullError(
            f"SQLite ran out of room for a write to {path} ({free / 1e6:,.0f} MB are free on "
            "its disk): the disk of the temporary folder (TMPDIR), or a file size limit, is full")
    # Without its reserve at (nearly) its size (spent on an earlier full disk, taken back only
    # in part), freeing room needs room too.
    way_out = (", or make room in kvdesk: `kvdesk gc --budget-gb N` drops least recently used "
               "caches down to N GB (documents and chats are kept), `kvdesk rm` deletes a "
               "document or chat") if held(path.parent) else (
        " first: kvdesk's reserve for this is spent, so `kvdesk rm` and `gc` need room too")
    return DiskFullError(
        f"the disk holding the data directory {path.parent} is full "
        f"({'its free space unknown' if free is None else f'{free / 1e6:,.1f} MB free'}): "
        "kvdesk could not write there (that write was undone). Free space on that disk"
        + way_out)
