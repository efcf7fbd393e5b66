"""A data directory on a drive: one the system turned read-only after an error (writes fail
with EROFS while the mount table says "rw"), one unplugged, one whose file system SQLite's
write-ahead log cannot use. Each says what it is; none is a traceback or a new, empty store.

The drives are simulated (tests cannot mount): the system calls answer as such a drive's do."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from test_store_helpers import open_store

from desktop_app.app import App
from desktop_app.cli.base import only_reading
from desktop_app.server import bridge
from desktop_app.server.api import create_api
from desktop_app.settings import Settings
from store import ReadOnlyError, Store
from store.errors import DataDirError

TURNED = "its file system turned read-only, as a system does with a drive after an error"


def _turn_read_only(monkeypatch, folder):
    """Every open for writing under `folder` fails with EROFS, as on ext4 after an error
    (errors=remount-ro: `emergency_ro`); reads, os.access and statvfs go on as before."""
    real = os.open

    def refusing(path, flags, *args, **kwargs):
        if str(path).startswith(str(folder)) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)


def test_a_drive_turned_read_only_while_open_refuses_writes_as_read_only(tmp_path, monkeypatch):
    store = open_store(tmp_path / "data")
    chat = store.create_chat("before")
    with store.locks.turn(chat.id):
        pass
    _turn_read_only(monkeypatch, tmp_path / "data")
    with pytest.raises(ReadOnlyError, match=TURNED):
        store.check_writable()
    assert store.read_only
    with pytest.raises(ReadOnlyError, match=TURNED):
        store.create_chat("after")
    # (filelock opens a lock file for writing at every turn: EROFS there was a traceback)
    with pytest.raises(ReadOnlyError, match=TURNED), store.locks.turn(chat.id):
        pass
    assert [c.title for c in store.chats()] == ["before"]
    store.close()


def test_a_drive_read_only_from_the_start_is_read_as_a_read_only_one(tmp_path, monkeypatch):
    with open_store(tmp_path / "data") as store:
        store.create_chat("kept")
    _turn_read_only(monkeypatch, tmp_path / "data")
    with Store(tmp_path / "data") as store:
        assert store.read_only
        assert [c.title for c in store.chats()] == ["kept"]
        assert store.verify()["corrupt"] == []
        with pytest.raises(ReadOnlyError, match=TURNED):
            store.create_chat("new")


def test_health_says_a_drive_turned_read_only(tmp_path, monkeypatch):
    app = App(Settings(data_dir=str(tmp_path / "data")))
    client = TestClient(create_api(app, api_key=None, stopping=bridge.Stopping()),
                        base_url="http://127.0.0.1:8765")
    assert client.get("/v1/kvdesk/health").json()["status"] == "ok"
    _turn_read_only(monkeypatch, tmp_path / "data")
    health = client.get("/v1/kvdesk/health").json()
    assert health["status"] == "storage_unavailable" and TURNED in health["problem"]
    app.store.close()


def _drive(monkeypatch, mount):
    """`mount` stands for a drive's mount point while `plugged` holds True."""
    real, plugged = os.path.ismount, [True]
    monkeypatch.setattr(os.path, "ismount",
                        lambda p: real(p) or (plugged[0] and str(p) == str(mount)))
    return plugged


def test_a_data_directory_whose_drive_is_unplugged_is_not_made_a_new_empty_store(
        tmp_path, monkeypatch):
    mount, data = tmp_path / "stick", tmp_path / "stick" / "kv"
    plugged = _drive(monkeypatch, mount)
    settings = Settings(data_dir=str(data))
    with App(settings).store as store:
        store.create_chat("on the stick")
    shutil.move(mount, tmp_path / "away")  # unplugged: the mount point stays, empty
    mount.mkdir()
    plugged[0] = False
    # (every command, `kvdesk serve` and the window open the store through App.store)
    with pytest.raises(DataDirError, match=(
            f"the data directory {data} held a kvdesk store on the drive mounted at {mount}, "
            "and no drive is mounted there now: is it connected\\? Connect it and start "
            "kvdesk again .* To start a new, empty store in .* instead, delete ")):
        _ = App(settings).store
    app = App(settings)
    app.reads_only = True  # (`docs`, `chats`: not "nothing is stored there yet")
    with pytest.raises(DataDirError, match="is it connected"):
        only_reading(app)
    assert not data.exists()  # nothing made under the mount point
    mount.rmdir()
    shutil.move(tmp_path / "away", mount)  # plugged back
    plugged[0] = True
    with App(settings).store as store:
        assert [c.title for c in store.chats()] == ["on the stick"]


def test_a_data_directory_removed_from_a_drive_still_there_or_forgotten_starts_afresh(
        tmp_path, monkeypatch):
    mount, data = tmp_path / "stick", tmp_path / "stick" / "kv"
    plugged = _drive(monkeypatch, mount)
    settings = Settings(data_dir=str(data))
    App(settings).store.close()
    shutil.rmtree(data)  # removed on purpose: the drive is there
    with App(settings).store as store:
        assert store.chats() == []
    shutil.rmtree(data)
    plugged[0] = False
    with pytest.raises(DataDirError) as refused:
        _ = App(settings).store
    Path(str(refused.value).rsplit("delete ", 1)[1]).unlink()  # what the refusal says to do
    with App(settings).store as store:
        assert store.chats() == []


def _no_wal_open(path, read_only):
    """SQLite's open on a file system that cannot size its shared-memory file (fusefat, some
    network file systems): the files made, then "disk I/O error"."""
    path.write_bytes(path.read_bytes() if path.exists() else b"\0" * 4096)
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).write_bytes(b"")
    raise sqlite3.OperationalError("disk I/O error")


def test_a_file_system_without_what_the_write_ahead_log_needs_is_named_and_left_clean(
        tmp_path, monkeypatch):
    open_store(tmp_path / "kept").close()
    monkeypatch.setattr("store.datadir.db._open", _no_wal_open)
    with pytest.raises(DataDirError, match=(
            "kvdesk.sqlite cannot be opened: SQLite could not set up its write-ahead log there "
            ".* The file system of .*data( \\(.* at /.*\\))? does not support the shared memory "
            "and locking it needs.*: choose a data directory on a local disk")):
        Store(tmp_path / "data")
    assert not (tmp_path / "data").exists()  # nothing left of the store that was not made
    with pytest.raises(DataDirError, match="write-ahead log"):
        Store(tmp_path / "kept")
    assert (tmp_path / "kept" / "kvdesk.sqlite").stat().st_size > 4096  # a store is kept


def test_the_read_only_probe_never_opens_the_database_file(tmp_path, monkeypatch):
    """Closing any descriptor of the database file drops every POSIX lock SQLite holds on it
    in the process: another process then wrote under a reader ("disk I/O error")."""
    store = open_store(tmp_path / "data")
    real, opened = os.open, []
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(str(path)) or real(
        path, *a, **k))
    store.check_writable()
    store.create_chat("probed")
    assert opened and str(store.path) not in opened
    store.close()
