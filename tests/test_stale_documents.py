"""Documents cached only under another model, without a model: the listing ("stale") and the
engine, which caches them under the model loaded before a new chat about them, follow one rule
(`chat.library.DocumentCaches`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_store_helpers import open_store, put_entry

from desktop_app.chat.library import Library
from desktop_app.engine import Engine

OTHER = "model-b"


@pytest.fixture
def store(tmp_path):
    with open_store(tmp_path) as store:  # its entries are under "model-a"
        store.register_model(OTHER, "/models/b.gguf", {})
        yield store


def documents(store):
    """{title: id} of a document cached only under model-a, one under both models, one kept as
    passages, one with only a passage's entry, one with no cache, one cached by a chat only."""
    ids = {title: store.add_document(title, title, "text", type="txt").id
           for title in ("old", "both", "long", "passage", "none", "chat")}
    put_entry(store, range(300), document_id=ids["old"])
    put_entry(store, range(300), document_id=ids["both"])
    put_entry(store, range(300), document_id=ids["both"], fingerprint=OTHER)
    put_entry(store, range(300), document_id=ids["long"])
    store.add_passages(ids["long"], [SimpleNamespace(
        index=0, text="a passage", start=0, end=9, page=None, lines=(1, 1), heading=(),
        tokens=3)])
    put_entry(store, range(100), document_id=ids["passage"], passage=True, passage_hash="p")
    chat = store.create_chat("About it", [ids["chat"]])
    put_entry(store, range(200), chat_id=chat.id)
    return ids


def test_the_listing_and_the_rule_agree_on_what_is_stale(store):
    ids = documents(store)
    library = Library(store)
    listed = {d.title: d.status for d in library.documents(OTHER)}
    assert listed == {"old": "stale", "both": "ready", "long": "passages", "passage": "none",
                      "none": "none", "chat": "none"}
    every = [*ids.values(), ids["old"]]
    assert library.stale_documents(every, OTHER) == [ids["old"]]
    assert library.stale_documents(every, "model-a") == []
    assert {d.title for d in library.documents("model-a") if d.status == "stale"} == set()


def test_a_new_chat_caches_under_this_model_what_the_listing_calls_stale(store, monkeypatch):
    ids = documents(store)
    engine = Engine(store, lambda: pytest.fail("no model is loaded"), background=False)
    monkeypatch.setattr(Engine, "fingerprint", property(lambda self: OTHER))
    prefilled = []

    def prefill(doc_id, *, progress=None, cancel=None):
        prefilled.append(doc_id)
        return SimpleNamespace(passages=0, pulled=False)

    monkeypatch.setattr(engine, "prefill", prefill)
    notes = engine._cache_stale([ids["none"], ids["old"], ids["both"], ids["old"]], None, None)
    stale = [d.doc_id for d in engine.library.documents(OTHER) if d.status == "stale"]
    assert prefilled == stale == [ids["old"]]
    assert notes == [f"document {ids['old']} was cached under another model: its cache for "
                     "this one is computed and stored now, once"]
    assert engine._cache_stale([], None, None) == []
    # Its cache under this model found in the shared cache: taken from it, and said so (it
    # said computed, when nothing was).
    monkeypatch.setattr(engine, "prefill", lambda doc_id, **kw: SimpleNamespace(
        passages=0, pulled=True))
    assert engine._cache_stale([ids["old"]], None, None) == [
        f"document {ids['old']} was cached under another model: its cache for this one is "
        "taken from the shared cache and stored now, once"]
