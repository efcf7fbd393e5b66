"""A data directory whose file system takes no file as large as kvdesk may store (FAT32's
4 GB; here a process's `ulimit -f`): every cache is a row of one database file, so the budget
is kept within that, and a write that meets the limit anyway is a full disk's clear error,
never SQLite's "disk I/O error" as a traceback."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

from store.datadir import filesize

LIMIT = 24 << 20  # bytes a file may have in the child process

CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, "tests")
    from test_store_helpers import FP, open_store
    from store import DiskFullError
    LIMIT = int(sys.argv[2])
    store = open_store(sys.argv[1])
    print("budget", store.budget_bytes, store.budget_cap()[1], flush=True)
    store.set_setting("store.budget_bytes", 10**12)  # (a budget that cannot hold: a write can)
    print("budget kept", store.budget_bytes, flush=True)
    for n in range(40):  # (40 MB written: the budget evicts the oldest, the file stays within)
        with store.write_entry(FP, range(n * 64, n * 64 + 64), levels=("lossless",),
                               chunk_size=64) as w:
            w.put_chunk(w.spans[0].chunk_index, "lossless", os.urandom(1 << 20))
    print("within", os.path.getsize(sys.argv[1] + "/kvdesk.sqlite") < LIMIT, flush=True)
    try:  # (one entry larger than the file may be: written before the budget can act)
        with store.write_entry(FP, range(10**6, 10**6 + 64 * 40), levels=("lossless",),
                               chunk_size=64) as w:
            for span in w.spans:
                w.put_chunk(span.chunk_index, "lossless", os.urandom(1 << 20))
    except DiskFullError as e:
        print("refused:", e, flush=True)
    print("entries", len(store.entries()), flush=True)
""")


def test_a_file_size_limit_keeps_the_budget_within_it_and_says_so_when_met(tmp_path):
    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "data"), str(LIMIT)],
                           capture_output=True, text=True, timeout=300, preexec_fn=limited,
                           cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()})
    said = child.stdout.splitlines()
    assert child.returncode == 0 and "Traceback" not in child.stderr, child.stderr[-2000:]
    budget, why = said[0].split(" ", 2)[1:]
    assert int(budget) == int(LIMIT * filesize.BUDGET_SHARE) and "ulimit -f" in why
    assert said[1] == f"budget kept {int(LIMIT * filesize.BUDGET_SHARE)}"
    assert said[2] == "within True"
    refused = next(line for line in said if line.startswith("refused:"))
    assert "has reached the largest file its file system takes (0.0 GB: this process's " \
        "file size limit (ulimit -f))" in refused and "that write was undone" in refused
    assert int(said[-1].split()[1]) >= 1  # (what was stored before stays: the write undone)


def test_a_fat32_drive_is_told_by_its_type(tmp_path, monkeypatch):
    monkeypatch.setattr(filesize, "_fs_type", lambda folder: "vfat")
    most, why = filesize.file_limit(tmp_path)
    assert most == filesize.FAT_MOST and "FAT32" in why
    monkeypatch.setattr(filesize, "_fs_type", lambda folder: "exfat")
    assert filesize.file_limit(tmp_path) is None


def test_a_mount_point_with_a_space_is_read_as_its_path(tmp_path, monkeypatch):
    """(/proc/mounts writes "MY STICK" as MY\\040STICK: a stick with a label of two words
    read as the disk under it.)"""
    stick = tmp_path / "MY STICK"
    (stick / "kvdesk").mkdir(parents=True)
    mounts = tmp_path / "mounts"
    escaped = str(stick).replace(" ", "\\040")
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\n/dev/sdb1 {escaped} vfat rw 0 0\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(
        mounts if path == "/proc/mounts" else path, *a, **k))
    assert filesize._fs_type(stick / "kvdesk") == "vfat"
