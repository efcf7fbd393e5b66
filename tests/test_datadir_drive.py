"""A data directory on a drive: one the system turned read-only after an error (writes fail
with EROFS while the mount table says "rw"), one unplugged, one whose file system SQLite's
write-ahead log cannot use. Each says what it is; none is a traceback or a new, empty store.

The drives are simulated (tests cannot mount): the system calls answer as such a drive's do."""

from __future__ import annotations

import errno
import os

import pytest
from starlette.testclient import TestClient
from test_store_helpers import open_store

from desktop_app.app import App
from desktop_app.server import bridge
from desktop_app.server.api import create_api
from desktop_app.settings import Settings
from store import ReadOnlyError, Store

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
