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


class Reserve:
    def __init__(self, data_dir: Path, nbytes: int = RESERVE_BYTES):
        self.path = data_dir / NAME
        self.nbytes = nbytes

    def make(self) -> None:
        """Take the reserve while the disk has room for it twice over (never the last of it)."""
        with contextlib.suppress(OSError):  # a full or read-only disk: without one
            if self.path.exists() and self.path.stat().st_size >= self.nbytes:
                return
            if shutil.disk_usage(self.path.parent).free < 2 * self.nbytes:
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.nbytes)  # blocks taken, not a sparse file
            except OSError:
                os.close(fd)
                self.path.unlink(missing_ok=True)
                return
            os.close(fd)

    def release(self) -> bool:
        """Give the reserve back to the disk; whether there was one."""
        try:
            self.path.unlink()
        except OSError:
            return False
        return True
