"""A data directory removed, moved or replaced under a running kvdesk: every write stops with
one clear error (none goes to the file no longer there), an answer already computed still
reaches its caller, and the server's health says so."""

from __future__ import annotations

import errno
import os
import shutil
import threading

import pytest
from starlette.testclient import TestClient
from test_store_helpers import open_store

from desktop_app.app import App
from desktop_app.engine import Engine
from desktop_app.model.runtime import Runtime
from desktop_app.server import bridge
from desktop_app.server.api import create_api
from desktop_app.settings import Settings
from store import DataDirGoneError, Store
from store.datadir import place


def test_writes_stop_once_the_data_directory_is_removed_and_go_on_when_it_is_back(tmp_path):
    data = tmp_path / "data"
    store = open_store(data)
    store.add_document("first", "first", "text", type="txt")
    shutil.move(data, tmp_path / "away")
    with pytest.raises(DataDirGoneError, match=f"the data directory {data} was removed or "
                                               "moved while kvdesk ran: nothing more is stored"):
        store.add_document("second", "second", "text", type="txt")
    read = []  # a thread of its own opens a connection: SQLite would make a new, empty file
    worker = threading.Thread(target=lambda: read.append(_raised(store.documents)))
    worker.start()
    worker.join()
    assert isinstance(read[0], DataDirGoneError) and not data.exists()
    assert "it cannot be read" in str(read[0])
    assert "point kvdesk at its new place (--data-dir or Settings) or put it back" in str(read[0])
    shutil.move(tmp_path / "away", data)  # put back: the same file, written again
    store.add_document("third", "third", "text", type="txt")
    assert sorted(d.title for d in store.documents()) == ["first", "third"]
    store.close()


def test_a_store_file_replaced_under_kvdesk_is_not_written(tmp_path):
    store = open_store(tmp_path)
    shutil.copy(store.path, tmp_path / "copy.db")
    (tmp_path / "copy.db").replace(store.path)
    with pytest.raises(DataDirGoneError, match="the store .* was replaced by another file "
                                               "while kvdesk ran: .*a restart opens that one"):
        store.add_document("lost", "lost", "text", type="txt")
    store.close()


def test_a_removed_store_file_is_said_so_with_what_a_restart_does(tmp_path):
    store = open_store(tmp_path)
    store.path.unlink()
    with pytest.raises(DataDirGoneError, match="the store .* was removed or moved while kvdesk "
                                               "ran: .*if its drive was unplugged, connect it "
                                               "again and restart kvdesk; .*if it was removed, "
                                               "restart kvdesk: it starts an empty store there"):
        store.add_document("lost", "lost", "text", type="txt")
    store.close()


@pytest.mark.parametrize("fails", [1, 2])
def test_a_store_that_cannot_be_looked_at_for_a_moment_is_not_called_gone(
        tmp_path, monkeypatch, fails):
    """EIO, ESTALE, EACCES (a network share): tried once more, then left to SQLite."""
    store = open_store(tmp_path)
    stat, calls = os.stat, []

    def flaky(path, *args, **kwargs):
        calls.append(path)
        if len(calls) <= fails:
            raise OSError(errno.ESTALE, "Stale file handle", str(path))
        return stat(path, *args, **kwargs)

    monkeypatch.setattr(place.os, "stat", flaky)
    store.add_document("kept", "kept", "text", type="txt")
    monkeypatch.setattr(place.os, "stat", stat)
    assert [d.title for d in store.documents()] == ["kept"]
    store.close()


def _raised(call):
    try:
        call()
    except Exception as e:
        return e
    return None


def test_health_says_when_nothing_more_can_be_stored(tmp_path):
    app = App(Settings(data_dir=str(tmp_path / "data")))
    client = TestClient(create_api(app, api_key=None, stopping=bridge.Stopping()),
                        base_url="http://127.0.0.1:8765")
    assert client.get("/v1/kvdesk/health").json()["status"] == "ok"
    shutil.rmtree(tmp_path / "data")
    health = client.get("/v1/kvdesk/health").json()
    assert health["status"] == "storage_unavailable"
    assert "was removed or moved while kvdesk ran" in health["problem"]
    app.store.close()


@pytest.mark.model
def test_an_answer_whose_data_directory_vanished_meanwhile_is_returned_unstored(
        tmp_path, model_path, model_hash):
    data = tmp_path / "data"
    eng = Engine(Store(data), lambda: Runtime(model_path, model_hash=model_hash, n_ctx=1024),
                 chunk_tokens=64)
    (tmp_path / "doc.txt").write_text("The lead engineer was Alice Smith.\n")
    doc = eng.attach(tmp_path / "doc.txt").doc_id
    assert eng.storage_problem is None
    removed = []

    def on_token(_text):  # the folder goes while the answer streams
        if not removed:
            removed.append(shutil.rmtree(data))

    try:
        result = eng.ask("Who was the lead engineer?", doc_ids=[doc], on_token=on_token,
                         generation=eng.generation_defaults.__class__(max_tokens=6))
        assert removed and result.answer and result.chat_id == 0
        assert any(m.startswith("this turn is not stored: the data directory")
                   for m in result.messages), result.messages
        # a conversation's cache (the OpenAI route's) is not kept either, and says why
        rt = eng.runtime
        kept, said = eng.session.kv.keep_prefix(rt, rt.tokens)
        assert not kept and "was removed or moved while kvdesk ran" in said[0]
        # the window's idle line goes on saying it (not only the turn's own message)
        assert "was removed or moved while kvdesk ran" in eng.storage_problem
    finally:
        eng.close()
        eng.store.close()
