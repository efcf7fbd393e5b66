"""Documents cached only under another model, without a model: the listing ("stale") and the
engine, which caches them under the model loaded before a new chat about them, follow one rule
(`chat.library.DocumentCaches`). The chat list's mark (kv_mode) is "exact" only when a cache of
the chat's own holds the start of its latest context, as a reopen reads it: a cache made for
an earlier turn whose passages a follow-up changed leaves the chat "blended"."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from test_store_helpers import FP, open_store, put_entry

from desktop_app.chat.library import Library
from desktop_app.engine import Engine
from desktop_app.results import AskResult

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
        return SimpleNamespace(passages=0, pulled=False, warnings=[], kept_tokens=120)

    monkeypatch.setattr(engine, "prefill", prefill)
    computed = [0]
    notes = engine._cache_stale([ids["none"], ids["old"], ids["both"], ids["old"]], None, None,
                                computed)
    stale = [d.doc_id for d in engine.library.documents(OTHER) if d.status == "stale"]
    assert prefilled == stale == [ids["old"]]
    assert notes == [f"document {ids['old']} was cached under another model: its cache for "
                     "this one is computed and stored now, once"]
    # (its tokens are the answer's: it said 0 recomputed and a first token in 0.5 s, after 5 s)
    assert computed == [120]
    assert engine._cache_stale([], None, None, computed) == [] and computed == [120]
    # Its cache under this model found in the shared cache: taken from it, and said so (it
    # said computed, when nothing was).
    monkeypatch.setattr(engine, "prefill", lambda doc_id, **kw: SimpleNamespace(
        passages=0, pulled=True, warnings=[], kept_tokens=0))
    assert engine._cache_stale([ids["old"]], None, None, [0]) == [
        f"document {ids['old']} was cached under another model: its cache for this one is "
        "taken from the shared cache and stored now, once"]
    # What storing it evicted is said too: under Gemma, SmolLM2's cache of the document went
    # unsaid (the prefill's notes were dropped).
    evicted = "storing this evicted the least recently used caches ... (4.9 MB); ..."
    monkeypatch.setattr(engine, "prefill", lambda doc_id, **kw: SimpleNamespace(
        passages=0, pulled=False, warnings=[evicted], kept_tokens=120))
    assert engine._cache_stale([ids["old"]], None, None, [0])[1:] == [evicted]
    waited = AskResult(chat_id=1, answer="", ttft_s=0.5, restore_s=0.0, bytes_read=0,
                       chunk_levels=[], recomputed_tokens=3, tokens_generated=1).after(5.0, 120)
    assert (waited.ttft_s, waited.recompute_s, waited.recomputed_tokens) == (5.5, 5.0, 123)


# -- the chat list's mark ----------------------------------------------------------------

def passage(doc_id: int, text: str) -> dict:
    return {"passage_id": hash(text) % 1000, "document_id": doc_id, "index": 0, "text": text,
            "score": 1.0}


def turn(store, chat_id, question, sources):
    store.add_turn(chat_id, question, "answer", stats={"sources": sources}, model=FP,
                   question_tokens=[1], answer_tokens=[2])


def kv_mode(library: Library, chat_id: int) -> str | None:
    return {c.chat_id: c.kv_mode for c in library.chats()}[chat_id]


def test_a_cache_of_an_earlier_turn_with_other_passages_leaves_the_chat_blended(tmp_path):
    clock = itertools.count(1000.0)  # every write a moment later
    with open_store(tmp_path, clock=lambda: next(clock)) as store:
        library = Library(store)
        a = store.add_document("a", "plant_manual.md", "alpha", type="md")
        b = store.add_document("b", "generators.pdf", "beta", type="pdf")
        tamsin, orvalis = [passage(a.id, "Tamsin")], [passage(b.id, "Orvalis")]
        chat = store.start_chat("Tamsin", [a.id, b.id], "Tamsin?", "answer",
                                stats={"sources": tamsin}, model=FP, question_tokens=[1],
                                answer_tokens=[2]).id
        assert kv_mode(library, chat) == "blended"  # nothing of its own stored yet
        put_entry(store, range(300), chat_id=chat)  # its exact context, made in the background
        assert kv_mode(library, chat) == "exact"
        # A follow-up reading other passages: the stored cache starts with the first ones.
        turn(store, chat, "Orvalis?", orvalis)
        assert kv_mode(library, chat) == "blended"
        put_entry(store, range(400), chat_id=chat)
        assert kv_mode(library, chat) == "exact"
        # One reading the same passages again starts with what is stored: exact.
        turn(store, chat, "Who supplies its fuel?", orvalis)
        assert kv_mode(library, chat) == "exact"
        turn(store, chat, "And Tamsin's code?", tamsin + orvalis)
        assert kv_mode(library, chat) == "blended"


def test_a_chat_over_whole_documents_is_exact_once_any_of_its_caches_is_stored(tmp_path):
    clock = itertools.count(1000.0)
    with open_store(tmp_path, clock=lambda: next(clock)) as store:
        library = Library(store)
        a = store.add_document("a", "A", "alpha", type="txt")
        b = store.add_document("b", "B", "beta", type="txt")
        chat = store.start_chat("c", [a.id, b.id], "q", "answer", stats={"sources": []},
                                model=FP, question_tokens=[1], answer_tokens=[2]).id
        put_entry(store, range(300), chat_id=chat)
        turn(store, chat, "q2", [])  # its documents' prefix is the same whatever the turn
        turn(store, chat, "q3", [])
        assert kv_mode(library, chat) == "exact"
