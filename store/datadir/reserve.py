"""Room kept in reserve on the data directory's disk, so that freeing space works on a full disk.

SQLite deletes through its write-ahead log: dropping a cache writes a few pages first, and a log
holding pages the database file has not taken in yet cannot be checkpointed without room to
grow the file. On a disk filled to the last byte (by kvdesk's caches or by anything else),
`rm` and `gc` would fail for want of the space they are to free, and the user would have no
way out through kvdesk. So the store keeps a file of `RESERVE_BYTES` beside its database while
the disk has room for it; a deletion that meets a full disk releases it and runs once more, and
the reserve is made again once the disk has room.

The reserve pays only for what it was given back for (opening the store, a deletion: freeing
space): what that did not use is taken back at once (`make`), so a write that follows (a
cache's megabytes) meets the full disk, never the reserve's room. A turn's question and answer
(the user's words, which nothing computes again) have a small reserve of their own
(`WordsReserve`), given a slice at a time, so that turns on a full disk never spend the room
`rm` and `gc` need. The files never hold data; this module never touches the database.

Another program writing to that disk can take room between its release and its retaking: a
slice of the words' reserve at most, and the main one only while a deletion runs, after which
the disk has the room the deletion freed to take it again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from pathlib import Path

RESERVE_BYTES = 16 << 20  # a checkpoint of SQLite's default log (4 MB) and a chunk's write
NAME = "reserve"
# A turn's text on a full disk: 2 MB, 256 KB a try. Measured on a 40 MB tmpfs filled to the
# last byte: a turn of a 200 KB answer grows the log by 235 KB (its pages and the full-text
# index's), and there the log cannot be handed back (the database file has no room to take
# its pages in), so one slice keeps such a turn, and the whole 8 of them before a turn is
# refused; small enough to leave a disk that is nearly full its room.
WORDS_NAME = "reserve-words"
WORDS_BYTES = 2 << 20
WORDS_SLICE = 256 << 10
_BLOCK = 1 << 20


def held(data_dir: Path) -> bool:
    """Whether the reserve for freeing space is there at (nearly) its size: `rm` and `gc`
    work on a full disk."""
    try:
        return (data_dir / NAME).stat().st_size >= RESERVE_BYTES * 3 // 4
    except OSError:
        return False


class Reserve:
    """The reserve file of one data directory for freeing space (`nbytes` None: RESERVE_BYTES
    when it is made)."""

    name = NAME

    def __init__(self, data_dir: Path, nbytes: int | None = None):
        self.path = data_dir / self.name
        self.nbytes = nbytes
        self.owed = 0  # what `release` gave back and `make` has not taken back yet
        # (`owed` is read and changed by every thread that meets a full disk)
        self._lock = threading.Lock()

    def size(self) -> int:
        return RESERVE_BYTES if self.nbytes is None else self.nbytes

    def make(self) -> None:
        """Take back what `release` gave and the work it was given for did not use (as much
        of it as the disk has free: it was the reserve's, not another program's), then the
        whole reserve while the disk has room for it and a quarter more (never the last of
        it: the room a `gc` freed on a full disk is enough to take it again)."""
        size = self.size()
        with self._lock:
            if self.owed:
                self._take_back(min(self.owed, size))
                self.owed = 0
            self._grow(size)

    def grow(self) -> None:
        """The whole reserve, where the disk has room for it and a quarter more, unless it is
        given back now (the work it was given for runs on another thread)."""
        with self._lock:
            if not self.owed:
                self._grow(self.size())

    def _grow(self, size: int) -> None:
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
        with self._lock:
            try:
                held = self.path.stat().st_size
                self.path.unlink()
            except OSError:
                return False
            self.owed += held
            return True

    def _take_back(self, size: int) -> None:
        """A reserve of up to `size` bytes from what the disk has free (a file system keeps
        a few blocks of its own for a file: a little less where all of it does not go)."""
        with contextlib.suppress(OSError):
            have = self.path.stat().st_size if self.path.exists() else 0
            free = shutil.disk_usage(self.path.parent).free
            for want in (free, free - (64 << 10), free - (1 << 20)):
                want = min(size, have + want)
                if want <= have:
                    return
                try:
                    _allocate(self.path, want)
                    return
                except OSError:
                    if have == 0:
                        self.path.unlink(missing_ok=True)


class WordsReserve(Reserve):
    """The reserve file of a turn's text: given back a slice at a time (`give`), never all of
    it at once, so that another program writing meanwhile can take a slice at most."""

    name = WORDS_NAME

    def size(self) -> int:
        return WORDS_BYTES if self.nbytes is None else self.nbytes

    def give(self) -> bool:
        """Give back one slice (the file's last bytes); whether there was one."""
        with self._lock:
            try:
                have = self.path.stat().st_size
                if have == 0:
                    return False
                os.truncate(self.path, max(0, have - WORDS_SLICE))
            except OSError:
                return False
            self.owed += min(have, WORDS_SLICE)
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
