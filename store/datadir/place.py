"""Where the store's database file is: noticing that it was removed, moved or replaced while
kvdesk ran.

SQLite keeps writing to the file it opened, even once that file is unlinked (a deleted data
directory) or renamed away: every later chat and cache would land in a file nobody will read
again. This module compares the file at the path with the one opened (device and inode), for
`Connections` to check before each write transaction and each new connection. It must never
write, create or remove anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import DataDirGoneError


def identity(path: Path) -> tuple[int, int] | None:
    """The file at `path` (device, inode), or None where there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class Place:
    """The database file's identity as opened (`fix`), and whether it is still there (`check`).

    One stat() per check: microseconds (under 10 here), against the millisecond or more of a
    write transaction's fsync."""

    def __init__(self, path: Path):
        self.path = path
        self.opened: tuple[int, int] | None = None

    def fix(self) -> None:
        """Remember the file now at the path as the one the store opened."""
        self.opened = identity(self.path)

    def check(self) -> None:
        """Raise DataDirGoneError if the file at the path is not the one opened (none at all,
        or another). A folder put back where it was passes again."""
        if self.opened is None or identity(self.path) == self.opened:
            return
        data_dir = self.path.parent
        what = (f"the store {self.path} was removed, moved or replaced" if data_dir.is_dir()
                else f"the data directory {data_dir} was removed or moved")
        raise DataDirGoneError(
            f"{what} while kvdesk ran: nothing more is stored (it would be lost with the "
            "file); restart kvdesk (it starts an empty store there) or put the folder back")
