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
    """The file at `path` (device, inode), or None where there is none (ENOENT, ENOTDIR).
    Another error (EIO, ESTALE, EACCES: a network share's hiccup) is tried once more, then
    raised: it says nothing of where the file is."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
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
        try:
            self.opened = identity(self.path)
        except OSError:
            self.opened = None  # (not known: not checked; SQLite says what it meets)

    def check(self, *, reading: bool = False) -> None:
        """Raise DataDirGoneError if the file at the path is not the one opened (none at all,
        or another). A folder put back where it was passes again. `reading`: for a new
        connection, which would read as well as write. A path that cannot be looked at now
        passes: SQLite's own error follows, if any."""
        try:
            now = identity(self.path)
        except OSError:
            return
        if self.opened is None or now == self.opened:
            return
        data_dir = self.path.parent
        if now is not None:
            what, advice = (f"the store {self.path} was replaced by another file",
                            "a restart opens that one")
        else:
            what = (f"the store {self.path} was removed or moved" if data_dir.is_dir()
                    else f"the data directory {data_dir} was removed or moved")
            advice = ("if its drive was unplugged, connect it again and restart kvdesk; if it "
                      "was moved or renamed, point kvdesk at its new place (--data-dir or "
                      "Settings) or put it back; if it was removed, restart kvdesk: it starts an "
                      "empty store there")
        lost = ("it cannot be read, and nothing more is stored" if reading
                else "nothing more is stored (it would be lost with the file)")
        raise DataDirGoneError(f"{what} while kvdesk ran: {lost}; {advice}")
