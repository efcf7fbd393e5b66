"""The largest file the data directory's file system takes, where it takes less than kvdesk
may store: every cache is a row of one database file, so a FAT32 drive (4 GB a file; known on
Linux, by /proc/mounts) or a process's file-size limit (`ulimit -f`) caps the whole store.

It reads /proc/mounts, the process's limits and files' sizes: it never writes, and never
touches the database.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

try:
    import resource
except ImportError:  # (Windows: no process file-size limit)
    resource = None

from ..errors import DiskFullError
from .mounts import mount_of

FAT_MOST = (4 << 30) - 1  # FAT32: a file's size is a 32-bit number
_FAT_TYPES = {"vfat", "msdos", "fat", "umsdos", "fuse.fusefat"}
# Of that limit, the budget keeps this share: the log (-wal) and the free pages of a file that
# evicts are on top of the caches the budget counts.
BUDGET_SHARE = 0.85


def file_limit(folder: Path) -> tuple[int, str] | None:
    """(the largest file `folder`'s file system and this process allow, why), or None where
    nothing is known to limit one below what kvdesk may store."""
    soft = None if resource is None else resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    limits = [] if soft is None or soft == resource.RLIM_INFINITY else [
        (soft, "this process's file size limit (ulimit -f)")]
    if _fs_type(folder) in _FAT_TYPES:
        limits.append((FAT_MOST, "its drive is formatted FAT32, which holds files of at most "
                                 "4.3 GB"))
    return min(limits) if limits else None


def _fs_type(folder: Path) -> str | None:
    """The type of the file system `folder` is on (Linux: /proc/mounts), or None."""
    found = mount_of(folder)
    return None if found is None else found[1]


def too_large(error: sqlite3.DatabaseError, path: Path) -> DiskFullError | None:
    """What SQLite's "disk I/O error" means when the database at `path` (or its log) has
    reached the largest file its file system takes (the write was refused with EFBIG): the
    user's error, as a full disk's; None for any other error."""
    if (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF != sqlite3.SQLITE_IOERR:
        return None
    limit = file_limit(path.parent)
    sizes = []
    for name in (path, path.with_name(path.name + "-wal")):
        try:
            sizes.append(name.stat().st_size)
        except OSError:
            pass
    if limit is None or max(sizes, default=0) < limit[0] - (16 << 20):
        return None
    return DiskFullError(
        f"{path} holds every cache kvdesk keeps, and it has reached the largest file its file "
        f"system takes ({limit[0] / 1e9:.1f} GB: {limit[1]}): kvdesk could not write there "
        "(that write was undone). Lower the storage budget well below that (`kvdesk gc "
        "--budget-gb N`, and the setting storage_budget_gb), or move the data folder to a "
        "drive formatted exFAT, NTFS, APFS or ext4")
