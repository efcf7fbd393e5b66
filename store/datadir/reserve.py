"""Room kept in reserve on the data directory's disk, so that freeing space works on a full disk.

SQLite deletes through its write-ahead log: dropping a cache writes a few pages first, and a log
holding pages the database file has not taken in yet cannot be checkpointed without room to
grow the file. On a disk filled to the last byte (by kvdesk's caches or by anything else),
`rm` and `gc` would fail for want of the space they are to free, and the user would have no
way out through kvdesk. So the store keeps a file of `RESERVE_BYTES` beside its database while
the disk has room for it; a deletion that meets a full disk releases it and runs once more, and
the reserve is made again once the disk has room. The file never holds data; this module never
touches the database.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

RESERVE_BYTES = 16 << 20  # a checkpoint of SQLite's default log (4 MB) and a chunk's write
NAME = "reserve"
_BLOCK = 1 << 20


class Reserve:
    """The reserve file of one data directory (`nbytes` None: RESERVE_BYTES when it is made)."""

    def __init__(self, data_dir: Path, nbytes: int | None = None):
        self.path = data_dir / NAME
        self.nbytes = nbytes

    def make(self) -> None:
        """Take the reserve while the disk has room for it and a quarter more (never the last
        of it: the room a `gc` freed on a full disk is enough to take it again)."""
        size = RESERVE_BYTES if self.nbytes is None else self.nbytes
        with contextlib.suppress(OSError):  # a full or read-only disk: without one
            if self.path.exists() and self.path.stat().st_size >= size:
                return
            if shutil.disk_usage(self.path.parent).free < size + size // 4:
                return
            try:
                _allocate(self.path, size)
            except OSError:
                self.path.unlink(missing_ok=True)

    def release(self) -> bool:
        """Give the reserve back to the disk; whether there was one."""
        try:
            self.path.unlink()
        except OSError:
            return False
        return True


def _allocate(path: Path, size: int) -> None:
    """A file of `size` bytes whose blocks are taken, not a sparse one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        if hasattr(os, "posix_fallocate"):  # (not on macOS or Windows)
            os.posix_fallocate(fd, 0, size)
            return
        zeros = bytes(_BLOCK)
        for at in range(0, size, _BLOCK):
            os.write(fd, zeros[:min(_BLOCK, size - at)])
        os.fsync(fd)
    finally:
        os.close(fd)
