"""A data directory on a drive that can go away (a USB stick, an external disk, a network
mount): a store made there is remembered, so that the folder found empty or missing while the
drive is unplugged is not silently made a new, empty store on the disk under the mount point
(hidden again, with what was stored in it, once the drive is back).

The rule: a data directory whose nearest mount point is not the root file system is
remembered (`remember`: its path and that mount point, one small file per folder in a memo
folder the caller names, outside the data directory); a data directory that holds no store
is refused (`check_connected`) where it was remembered and its mount point is not mounted
now: the drive that held it is not there. One whose drive is there but whose folder was
removed is a folder removed on purpose: a new store is made there, as anywhere else.

The root file system cannot be unplugged: nothing is remembered for it. This module never
touches a data directory's files; it writes only in the memo folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from ..errors import DataDirError


def mount_point(path: Path) -> Path:
    """The mount point of the file system that holds `path` (or would: its nearest existing
    folder)."""
    p = Path(os.path.realpath(path))
    while not os.path.ismount(p):
        p = p.parent
    return p


def memo_file(memo: Path, data_dir: Path) -> Path:
    """Where the memo folder `memo` remembers the data directory `data_dir`."""
    key = hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:16]
    return memo / f"{key}.json"


def remember(memo: Path, data_dir: Path) -> None:
    """Remember that `data_dir` holds a store, where its file system can go away. Best
    effort: a memo folder that cannot be written leaves the folder unremembered."""
    mount = mount_point(data_dir)
    if mount == mount.parent:  # the root file system
        return
    record = {"data_dir": os.path.realpath(data_dir), "mount": str(mount)}
    path = memo_file(memo, data_dir)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()) == record:
            return  # (the usual case: nothing written)
    with contextlib.suppress(OSError):
        memo.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)


def check_connected(memo: Path, data_dir: Path) -> None:
    """Raise DataDirError where `data_dir`, holding no store now, was remembered as holding
    one on a drive that is not mounted now. The caller checks only a folder with no store."""
    path = memo_file(memo, data_dir)
    try:
        record = json.loads(path.read_text())
        mount = Path(record["mount"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # (never remembered, or a memo unreadable: nothing known)
    if record.get("data_dir") != os.path.realpath(data_dir) or os.path.ismount(mount):
        return
    raise DataDirError(
        f"the data directory {data_dir} held a kvdesk store on the drive mounted at {mount}, "
        "and no drive is mounted there now: is it connected? Connect it and start kvdesk "
        "again (mounted at another place: point kvdesk there, with --data-dir or Settings). "
        f"To start a new, empty store in {data_dir} instead, delete {path}")
