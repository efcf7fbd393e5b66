"""`kvdesk backup`: a consistent copy of the store, made while another connection writes;
without the caches, smaller and still searchable; a refused, stopped or failed backup leaves
nothing behind. No model needed."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

import store.backup as backup_module
from store import BackupError, Store
from store.backup import backup
from store.errors import StoppedError
from tests.test_store_helpers import FP, open_store, put_entry

CACHES = ("kv_entries", "kv_spans", "kv_chunks", "kv_entry_documents")
WORDS = "the quarterly invoice names a penguin as treasurer of the rowing club"


@pytest.fixture
def data(tmp_path) -> Path:
    """A store with documents, chats, messages, passages and KV caches."""
    folder = tmp_path / "data"
    with open_store(folder) as store:
        for n in range(3):
            doc = store.add_document(f"h{n}", f"doc {n}", f"{WORDS} {n}", type="text")
            store.add_passages(doc.id, [SimpleNamespace(
                index=i, text=f"passage {i} of doc {n}: " + (WORDS if i == 2 else "filler"),
                start=0, end=10, page=None, lines=(1, 1), heading=("Intro",), tokens=9)
                for i in range(4)])
            chat = store.create_chat(f"chat {n}", [doc.id])
            for i in range(5):
                store.add_message(chat.id, "user", f"question {i}")
            put_entry(store, range(n * 10_000, n * 10_000 + 4_000), document_id=doc.id)
    return folder


def rows(path: Path, table: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr)
    finally:
        conn.close()


def test_a_backup_taken_while_another_connection_writes_holds_every_committed_row(
        data, tmp_path, monkeypatch):
    monkeypatch.setattr(backup_module, "STEP_PAGES", 2)  # many steps: commits between them
    before = rows(data / "kvdesk.sqlite", "messages")
    writer = Store(data)  # another process's connections, in effect
    chat = writer.chats()[0].id
    committed = threading.Event()

    def add():
        writer.add_message(chat, "assistant", "written during the backup")
        committed.set()

    steps = []

    def step(done, total):  # a commit lands between two steps of the copy
        steps.append(done)  # (each commit would restart a copy not held to one snapshot)
        assert len(steps) < 1000, "the copy starts again at each commit"
        committed.clear()
        thread = threading.Thread(target=add)
        thread.start()
        assert committed.wait(10)
        thread.join()

    try:
        done = backup(data, tmp_path / "copy", progress=step)
    finally:
        writer.close()
    copied = rows(tmp_path / "copy" / "kvdesk.sqlite", "messages")
    after = rows(data / "kvdesk.sqlite", "messages")
    assert len(after) > len(before) + 10  # (the writer went on through the copy)
    assert copied == before  # every row committed when it began; none half-written
    assert done["messages"] == len(before) and done["damage"] == []
    assert (tmp_path / "copy" / ".kvdesk-store-made").exists()
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == [
        ".kvdesk-store-made", "kvdesk.sqlite"]
    with Store(tmp_path / "copy") as copy:  # opens as a store, caches and all
        assert [d.title for d in copy.documents()] == ["doc 0", "doc 1", "doc 2"]
        assert copy.longest_prefix(FP, range(4_000)).n_tokens == 4_000


def test_without_caches_keeps_documents_chats_messages_and_search_and_is_smaller(
        data, tmp_path):
    whole = backup(data, tmp_path / "whole")
    slim = backup(data, tmp_path / "slim", caches=False)
    file = tmp_path / "slim" / "kvdesk.sqlite"
    assert slim["bytes"] < whole["bytes"] and slim["caches"] is False
    assert (tmp_path / "slim").stat().st_mode & 0o077 == 0  # (as the data folder: closed)
    for table in CACHES:
        assert rows(file, table) == []
    for table in ("documents", "chats", "chat_documents", "messages", "passages", "models",
                  "migrations", "sqlite_sequence", "passages_fts_data"):
        assert rows(file, table) == rows(data / "kvdesk.sqlite", table), table
    with Store(data) as source, Store(tmp_path / "slim") as copy:
        assert copy.search_passages(1, "penguin treasurer")
        assert [(p.id, s) for p, s in copy.search_passages(2, "penguin treasurer")] == [
            (p.id, s) for p, s in source.search_passages(2, "penguin treasurer")]
        assert [m.text for m in copy.messages(1)] == [m.text for m in source.messages(1)]
        assert copy.longest_prefix(FP, range(4_000)).n_tokens == 0  # computed again
        assert copy.damage is None
        # FTS5's own check of the copied index against the passages' text: the same index
        copy._db.get().conn.execute(
            "INSERT INTO passages_fts(passages_fts) VALUES ('integrity-check')")


@pytest.mark.parametrize("caches", [True, False])
def test_a_stopped_or_failed_backup_leaves_nothing(data, tmp_path, monkeypatch, caches):
    monkeypatch.setattr(backup_module, "STEP_PAGES", 8)
    monkeypatch.setattr(backup_module, "ROWS", 2)
    cancel = threading.Event()
    with pytest.raises(StoppedError):
        backup(data, tmp_path / "new", caches=caches, cancel=cancel,
               progress=lambda done, total: cancel.set())
    assert not (tmp_path / "new").exists()  # the folder it made, gone too
    (tmp_path / "empty").mkdir()

    def full(done, total):
        assert (tmp_path / "empty" / backup_module.PARTIAL).exists()
        e = sqlite3.OperationalError("database or disk is full")
        e.sqlite_errorcode = sqlite3.SQLITE_FULL
        raise e

    with pytest.raises(BackupError, match="is full.*nothing was left"):
        backup(data, tmp_path / "empty", caches=caches, progress=full)
    assert list((tmp_path / "empty").iterdir()) == []  # (the user's folder stays)


def test_a_folder_not_empty_or_inside_the_data_directory_is_refused(data, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    (tmp_path / "a file").write_text("x")
    for dest, why in ((tmp_path / "busy", "not empty"), (data / "backup", "inside the data"),
                      (data, "inside the data"), (tmp_path / "a file", "is a file")):
        with pytest.raises(BackupError, match=why):
            backup(data, dest)
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["notes.txt"]
    assert not (data / "backup").exists()
    with pytest.raises(BackupError, match="no kvdesk store"):
        backup(tmp_path / "nothing", tmp_path / "copy")


def test_a_read_only_data_folder_is_backed_up_without_writing_to_it(data, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setattr(backup_module.os, "access", lambda *a: False)
    opened, real = [], backup_module.open_connection
    monkeypatch.setattr(backup_module, "open_connection", lambda path, read_only: opened.append(
        read_only) or real(path, read_only=read_only))
    before = sorted(p.name for p in data.iterdir())
    assert backup(data, tmp_path / "copy", caches=False)["documents"] == 3
    assert opened == [True] and sorted(p.name for p in data.iterdir()) == before


def damage(data: Path, table: str) -> None:
    """A rotten page: the table's root overwritten."""
    path = data / "kvdesk.sqlite"
    conn = sqlite3.connect(path)
    root, size = conn.execute(f"SELECT rootpage, (SELECT page_size FROM pragma_page_size) "
                              f"FROM sqlite_master WHERE name = '{table}'").fetchone()
    conn.close()
    with path.open("r+b") as f:
        f.seek((root - 1) * size)
        f.write(b"\xff" * 64)


def test_a_damaged_store_is_copied_as_it_is_and_refused_without_caches(data, tmp_path):
    damage(data, "messages")
    damage(data, "messages_chat")  # (its index would count the rows)
    with pytest.raises(BackupError, match="damaged.*with them copies the file whole"):
        backup(data, tmp_path / "slim", caches=False)
    assert not (tmp_path / "slim").exists()
    done = backup(data, tmp_path / "whole")
    assert done["damage"]  # what SQLite's check finds, in the copy too
    assert done["messages"] is None and done["documents"] == 3  # (not counted: unreadable)
    # page by page as it is (past the header's change counter, which a backup counts up)
    assert (tmp_path / "whole" / "kvdesk.sqlite").read_bytes()[100:] == (
        data / "kvdesk.sqlite").read_bytes()[100:]


def kvdesk(*args: str) -> dict | list:
    proc = subprocess.run([sys.executable, "-m", "desktop_app", *args, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_cli_backup_opens_with_its_documents_and_chats(data, tmp_path):
    dest = tmp_path / "copy"
    done = kvdesk("--data-dir", str(data), "backup", str(dest), "--without-caches")
    assert (done["documents"], done["chats"], done["messages"]) == (3, 3, 15)
    assert [d["title"] for d in kvdesk("--data-dir", str(dest), "docs")] == [
        "doc 0", "doc 1", "doc 2"]
    assert sorted(c["title"] for c in kvdesk("--data-dir", str(dest), "chats")) == [
        "chat 0", "chat 1", "chat 2"]
