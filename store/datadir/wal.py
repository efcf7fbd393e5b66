"""A data directory on a file system where SQLite's write-ahead log cannot work: its
shared-memory file (`kvdesk.sqlite-shm`) cannot be sized or mapped (many FUSE and network file
systems), so every open fails with SQLite's bare "disk I/O error", which reads like damage.

This module recognizes that failure (`wal_unsupported`), names the file system
(`file_system`, from /proc/mounts where there is one) in the error the user reads
(`wal_error`), and removes what the failed open of a new store left (`remove_new`). It never
touches a store that existed before the open that failed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..errors import DataDirError
from .mounts import mount_of


def wal_unsupported(path: Path) -> bool:
    """Whether an open of the database file `path` that failed with "disk I/O error" left a
    shared-memory file SQLite could not size (it is empty: SQLite grows it before any use)."""
    try:
        return os.stat(path.with_name(path.name + "-shm")).st_size == 0
    except OSError:
        return False


def file_system(folder: Path) -> str | None:
    """The type and mount point of the file system holding `folder` ("fuse.fusefat at
    /media/stick"), from /proc/mounts; None where that cannot be read."""
    found = mount_of(folder)
    return None if found is None else f"{found[1]} at {found[0]}"


def wal_error(path: Path) -> DataDirError:
    """What a file system without what SQLite's write-ahead log needs means for the user."""
    fs = file_system(path.parent)
    return DataDirError(
        f"{path} cannot be opened: SQLite could not set up its write-ahead log there (disk I/O "
        f"error on its shared-memory file). The file system of {path.parent}"
        + (f" ({fs})" if fs else "")
        + " does not support the shared memory and locking it needs, as many FUSE and network "
        "file systems do not: choose a data directory on a local disk (--data-dir, "
        "KVDESK_DATA_DIR or Settings)")


def remove_new(path: Path, *, folder_made: bool) -> None:
    """Remove what a failed open of a new store at `path` left: the database file, its log
    and shared-memory file, and the data directory where that open made it (if empty)."""
    for name in (path.name, path.name + "-wal", path.name + "-shm"):
        with contextlib.suppress(OSError):
            path.with_name(name).unlink()
    if folder_made:
        with contextlib.suppress(OSError):
            path.parent.rmdir()
