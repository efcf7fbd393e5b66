"""Which mounted file system holds a folder, as Linux's /proc/mounts says: its mount point and
type (a FAT32 stick's 4 GB a file, a FUSE drive without what SQLite's log needs).

It only reads /proc/mounts: it never writes, and knows nothing of the store.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def mount_of(folder: Path) -> tuple[str, str] | None:
    """(mount point, file system type) of the file system holding `folder` (its longest
    mount point), or None where /proc/mounts cannot be read (not Linux)."""
    try:
        with open("/proc/mounts", encoding="utf-8", errors="replace") as mounts:
            lines = mounts.read().splitlines()
    except OSError:
        return None
    real, found = os.path.realpath(folder), None
    for fields in map(str.split, lines):
        if len(fields) < 3:
            continue
        point = _unescaped(fields[1])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (found is None or len(point) >= len(found[0])):
            found = (point, fields[2])
    return found


def _unescaped(point: str) -> str:
    """A mount point as /proc/mounts writes it, its spaces and tabs as octal escapes
    (`MY\\040STICK`), as the path it is."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point)
