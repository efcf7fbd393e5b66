"""A data directory kvdesk cannot use, or can only read: a clear StoreError, never a traceback,
and reading still works where nothing needs to be written."""

from __future__ import annotations

import os
import stat

import pytest
from test_store_helpers import open_store, put_entry

from store import Store, StoreError
from store.errors import DataDirError, ReadOnlyError


def test_a_file_in_place_of_the_data_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(DataDirError, match="is a file, not a folder"):
        Store(tmp_path / "f")
    with pytest.raises(DataDirError, match="part of its path is a file"):
        Store(tmp_path / "f" / "sub")


def test_a_file_that_is_not_a_database(tmp_path):
    (tmp_path / "kvdesk.sqlite").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(DataDirError, match="cannot be opened as a kvdesk store"):
        Store(tmp_path)


@pytest.fixture
def filled(tmp_path):
    with open_store(tmp_path) as store:
        doc = store.add_document("h", "Doc", "text", type="txt")
        put_entry(store, range(300), document_id=doc.id)
    return tmp_path


def _read_only_store(path, monkeypatch) -> Store:
    # As root, permission bits do not stop writes: stand for a read-only mount at the one
    # place the store asks.
    real = os.access
    monkeypatch.setattr("store.db.os.access",
                        lambda p, mode: False if mode & os.W_OK else real(p, mode))
    return Store(path)


def test_a_read_only_store_reads_and_refuses_writes_clearly(filled, monkeypatch):
    with _read_only_store(filled, monkeypatch) as store:
        assert store.read_only
        assert [d.title for d in store.documents()] == ["Doc"]
        assert store.verify()["corrupt"] == [] and store.verify()["chunks"] > 0
        assert store.longest_prefix("model-a", range(400)).n_tokens == 300
        assert store.register_model("model-b", "/b.gguf", {}) is None
        with pytest.raises(ReadOnlyError, match="read-only"):
            store.add_document("h2", "Other", "text", type="txt")
        with pytest.raises(ReadOnlyError):
            store.gc(0)


def test_an_empty_read_only_directory(tmp_path, monkeypatch):
    with pytest.raises(DataDirError, match="read-only and holds no kvdesk data"):
        _read_only_store(tmp_path, monkeypatch)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever the permission bits say")
def test_permission_bits_make_it_read_only(filled):
    mode = filled.stat().st_mode
    os.chmod(filled, stat.S_IRUSR | stat.S_IXUSR)
    try:
        with Store(filled) as store:
            assert store.read_only and store.documents()
            with pytest.raises(StoreError):
                store.create_chat("x")
    finally:
        os.chmod(filled, mode)
