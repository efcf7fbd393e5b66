"""What `kvdesk gc` and `kvdesk rm` say of the space they give back, over a store of made-up
entries (no model): gc names the caches it evicted, each model's with it, and rm how much its
caches took; their --json says the same."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from test_store_helpers import FP, open_store, put_entry

import desktop_app.cli.base as base
from desktop_app.cli import cli
from desktop_app.kv.evictions import storage_line
from desktop_app.results import size_text


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A store with document 1 (a.md) cached under model a and model b, and a chat about it
    with a cache of its own; the CLI's App made one over it."""
    store = open_store(tmp_path / "data")
    store.register_model("model-b", "/models/b.gguf", {"n_layer": 2})
    doc = store.add_document("h", "a.md", "text", type="md")
    chat = store.create_chat("chat", [doc.id])
    store.add_message(chat.id, "user", "hi")
    root = put_entry(store, range(100), document_id=doc.id)
    put_entry(store, range(150), parent_id=root.id, chat_id=chat.id)
    put_entry(store, range(100), fingerprint="model-b", document_id=doc.id)

    class Engine:
        def delete_document(self, doc_id):
            store.delete_document(doc_id)
            return []

        def delete_chat(self, chat_id):
            store.delete_chat(chat_id)

    class App:
        def __init__(self, settings, *, background, model_flag=False):
            self.store, self.engine = store, Engine()
            self.data_dir, self.reads_only, self.holds_store = tmp_path / "data", False, True

        def close(self):
            pass

    monkeypatch.setattr(base, "App", App)
    yield store
    store.close()


def kvdesk(tmp_path, *args):
    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def test_gc_names_what_it_evicted_each_models_with_it(store, tmp_path):
    """It said only "freed 14.4 MB; ..." (its --json listed the caches)."""
    out = kvdesk(tmp_path, "gc", "--budget-gb", "0")
    evicted = out.splitlines()[1]
    assert evicted.startswith("evicted document 1 (a.md), 1 chat cache(s) (model a.gguf's); "
                              "document 1 (a.md) (model b.gguf's) ("), out
    assert evicted.endswith("): they are computed again when next used")
    assert kvdesk(tmp_path, "gc", "--budget-gb", "0").splitlines()[1:] == []  # (none left)


def test_rm_says_how_much_its_caches_took(store, tmp_path):
    """It said "deleted chat 1" and nothing of the space given back."""
    chat = store.chats()[0].id
    took = {e.id: e.nbytes for e in store.entries() if e.chat_id == chat}
    assert kvdesk(tmp_path, "rm", "chat", str(chat)).strip() == (
        f"deleted chat {chat}, freeing {sum(took.values())} B of caches")
    left = store.usage_bytes()
    said = json.loads(kvdesk(tmp_path, "rm", "doc", "1", "--json"))
    assert said == {"deleted": "doc", "id": 1, "chats_kept": [], "freed_bytes": left}
    assert store.usage_bytes() == 0  # (every model's cache of it went)


def test_docs_ends_with_where_the_stored_bytes_go(store):
    """(`docs` added up the documents' caches only: chats' and other models' were unseen.)"""
    usage = store.usage_by_kind()
    ours, theirs = usage[FP], usage["model-b"]
    line = storage_line(store, FP)
    assert line.startswith(
        f"storage: {size_text(store.usage_bytes())} of the {size_text(store.budget_bytes)} "
        f"budget (documents {size_text(ours['documents'])}, chats {size_text(ours['chats'])}, "
        f"model b.gguf's caches {size_text(theirs['documents'])}); the data directory takes ")
    assert line.endswith("on disk (the database and the reserves kept for a full disk)")
    os.truncate(store.data_dir / "reserve", 1024)  # (mostly spent): not said to be there
    assert storage_line(store, FP).endswith("no reserve for a full disk: its disk has too "
                                            "little room now)")
    (store.data_dir / "reserve").unlink()  # (spent on a full disk): not said to be there
    assert storage_line(store, FP).endswith(
        "on disk (the database; no reserve for a full disk: its disk has too little room now)")


def test_a_gc_that_evicts_many_documents_names_a_few_and_counts_the_rest(tmp_path):
    """(`gc` on a 152-document library printed one line of ~100 documents, 3 KB.)"""
    from desktop_app.kv.evictions import evicted_line

    with open_store(tmp_path) as store:
        ids = [store.add_document(f"h{i}", f"doc{i}.md", "text", type="md").id
               for i in range(8)]
        line, = evicted_line(store, [{"document_id": d, "chat_id": None, "passage": False,
                                      "bytes": 1000, "model": FP} for d in ids])
    assert line.startswith("evicted document 1 (doc0.md), document 2 (doc1.md), ")
    assert "document 5 (doc4.md), 3 more documents' caches (8.0 KB): they are" in line
    assert "doc5.md" not in line


def test_gc_says_how_far_it_is_and_stops_between_evictions(store, tmp_path):
    """(A 20 s eviction showed nothing until it ended, and Ctrl-C lost its whole report.)"""
    import threading

    said: list[tuple[int, int]] = []
    cancel = threading.Event()
    used = store.usage_bytes()

    def first_then_stop(freed: int, over: int) -> None:
        said.append((freed, over))
        cancel.set()  # (Ctrl-C, after the first eviction)

    report = store.gc(0, progress=first_then_stop, cancel=cancel)
    assert report["stopped"] and len(said) == 1 and said[0][1] == used
    assert 0 < said[0][0] == report["freed_bytes"] < used == report["freed_bytes"] + \
        store.usage_bytes()
    report = store.gc(0, progress=lambda freed, over: said.append((freed, over)))
    assert not report["stopped"] and store.usage_bytes() == 0 and said[-1][0] == said[-1][1]
    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "gc", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["stopped"] is False


def test_a_gc_stopped_by_ctrl_c_still_says_what_it_evicted(store, tmp_path, monkeypatch):
    """(Stopped, its --json was only an error: the evictions it had committed went unsaid.)"""
    import contextlib
    import threading

    import desktop_app.cli.maintenance as maintenance

    cancel = threading.Event()
    gc = store.gc
    monkeypatch.setattr(store, "gc", lambda budget, **kw: gc(budget, **{**kw, "progress": (
        lambda freed, over: cancel.set())}))  # (Ctrl-C after the first eviction)
    monkeypatch.setattr(maintenance, "interruptible", lambda: contextlib.nullcontext(cancel))
    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "gc",
                                      "--budget-gb", "0", "--json"])
    assert result.exit_code == 130 and "Stopped by Ctrl-C" in result.stderr
    said = json.loads(result.stdout)
    assert said["stopped"] and said["freed_bytes"] > 0 and len(said["evicted_caches"]) >= 1
    assert store.usage_bytes() > 0  # (not all: it stopped)


def test_a_budget_larger_than_the_disks_room_is_said(store):
    """(A 100 MB drive under the 10 GB default: the disk filled first, never a word.)"""
    from desktop_app.kv.evictions import budget_room

    store.budget_bytes = 10**16
    said = budget_room(store)
    assert said.startswith("the storage budget leaves the caches ") and "free: it fills " \
        "first" in said
    store.budget_bytes = store.usage_bytes()
    assert budget_room(store) is None
