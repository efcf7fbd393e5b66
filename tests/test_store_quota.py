"""The KV budget: least recently used first, extensions with their parent, never user data."""

from __future__ import annotations

import sqlite3

import pytest
from test_store_helpers import FP, dead_pid, open_store

from store import BudgetFullError
from store.caches.quota import ABANDON_AFTER_S


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def tick(self) -> float:
        self.now += 1
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    with open_store(tmp_path, clock=clock) as store:
        yield store


def raw_entry(store, clock, tokens, size=1000, **kwargs):
    clock.tick()
    with store.write_entry(FP, tokens, levels=["raw"], **kwargs) as writer:
        for span in writer.spans:
            writer.put_chunk(span.chunk_index, "raw", bytes(size))
    return writer.entry


def test_least_recently_used_entries_go_first(store, clock):
    a = raw_entry(store, clock, range(0, 100))
    b = raw_entry(store, clock, range(100, 200))
    c = raw_entry(store, clock, range(200, 300))
    clock.tick()
    store.longest_prefix(FP, range(0, 100))  # a is now the most recent
    report = store.gc(budget_bytes=1500)
    assert report == {
        "evicted_entries": [b.id, c.id], "abandoned_entries": [], "abandoned_documents": [],
        "evicted_caches": [
            {"entry": e.id, "document_id": None, "chat_id": None, "passage": False,
             "bytes": 1000, "model": FP} for e in (b, c)],
        "freed_bytes": 2000,
        "bytes_after": 1000, "budget_bytes": 1500, "stopped": False,
    }  # fmt: skip
    assert [e.id for e in store.entries()] == [a.id]
    assert store.gc(budget_bytes=1500)["evicted_entries"] == []


def test_an_entry_is_evicted_with_the_entries_extending_it(store, clock):
    document = store.add_document("h", "Doc", "text", type="txt")
    chat = store.create_chat("chat", [document.id])
    store.add_message(chat.id, "user", "hi")
    root = raw_entry(store, clock, range(100), document_id=document.id)
    child = raw_entry(store, clock, range(200), parent_id=root.id, chat_id=chat.id)
    other = raw_entry(store, clock, range(500, 600))
    store.touch([child.id])  # a child more recent than its parent: it still cannot outlive it
    report = store.gc(budget_bytes=1000)
    assert report["evicted_entries"] == [root.id, child.id]
    assert [(c["document_id"], c["chat_id"]) for c in report["evicted_caches"]] == [
        (document.id, None), (None, chat.id)]
    assert [e.id for e in store.entries()] == [other.id]
    assert store.documents() == [document] and store.chats() == [chat]
    assert [m.text for m in store.messages(chat.id)] == ["hi"]


def test_finishing_an_entry_enforces_the_stored_budget(store, clock):
    store.budget_bytes = 2500
    first = raw_entry(store, clock, range(0, 100))
    raw_entry(store, clock, range(100, 200))
    raw_entry(store, clock, range(200, 300))
    assert first.id not in [e.id for e in store.entries()]
    assert store.usage_bytes() == 2000


def test_a_finished_entry_says_which_caches_it_evicted(store, clock):
    store.budget_bytes = 2500
    document = store.add_document("h", "Doc", "text", type="txt")
    old = raw_entry(store, clock, range(0, 100), document_id=document.id)
    raw_entry(store, clock, range(100, 200))
    clock.tick()
    with store.write_entry(FP, range(200, 300), levels=["raw"]) as writer:
        writer.put_chunk(0, "raw", bytes(1000))
    assert writer.evicted == [{"entry": old.id, "document_id": document.id, "chat_id": None,
                               "passage": False, "bytes": 1000, "model": FP}]


def test_each_evicted_cache_names_its_model(store, clock):
    """One store holds every model's caches under one budget: a cache of another model than
    the one storing went unnamed as such (its record had no model)."""
    store.register_model("model-b", "/models/b.gguf", {"n_layer": 2})
    store.budget_bytes = 1500
    old = raw_entry(store, clock, range(0, 100))
    clock.tick()
    with store.write_entry("model-b", range(100, 200), levels=["raw"]) as writer:
        writer.put_chunk(0, "raw", bytes(1000))
    assert [(c["entry"], c["model"]) for c in writer.evicted] == [(old.id, FP)]


def test_an_entry_larger_than_the_whole_budget_goes_alone(store, clock):
    store.budget_bytes = 2500
    kept = [raw_entry(store, clock, range(0, 100)), raw_entry(store, clock, range(100, 200))]
    clock.tick()
    with store.write_entry(FP, range(200, 300), levels=["raw"]) as writer:
        writer.put_chunk(0, "raw", bytes(3000))
    # evicting the others could not make it fit: they stay, and it is removed itself
    assert [(c["entry"], c["too_large"]) for c in writer.evicted] == [(writer.entry.id, True)]
    assert [e.id for e in store.entries()] == [e.id for e in kept]
    # nor one that fits alone, but not with the entry it extends (of no use without it)
    clock.tick()
    with store.write_entry(FP, range(200), levels=["raw"], parent_id=kept[0].id) as writer:
        writer.put_chunk(0, "raw", bytes(2000))
    assert writer.evicted[0]["too_large"] and writer.evicted[0]["bytes"] == 3000
    assert [e.id for e in store.entries()] == [e.id for e in kept]


def test_an_entry_written_not_to_evict_is_dropped_itself_when_it_does_not_fit(store, clock):
    store.budget_bytes = 2500
    kept = [raw_entry(store, clock, range(0, 100)), raw_entry(store, clock, range(100, 200))]
    with pytest.raises(BudgetFullError):
        raw_entry(store, clock, range(200, 300), evict=False)
    assert [e.id for e in store.entries()] == [e.id for e in kept]
    assert store.usage_bytes() == 2000
    # It fits: kept. An identical entry adopted in its place stays whatever the budget.
    fits = raw_entry(store, clock, range(300, 400), size=400, evict=False)
    assert fits is not None and store.usage_bytes() == 2400
    store.budget_bytes = 1
    assert raw_entry(store, clock, range(300, 400), size=400, evict=False).id == fits.id
    # (stored ahead of need, it is least recently used: the next test)
    assert [e.id for e in store.entries()] == [fits.id] + [e.id for e in kept]


def test_an_entry_stored_ahead_of_need_goes_before_what_was_used(store, clock):
    """The background pass's passages (written not to evict) are least recently used until
    a question reads one: a question's store evicts them first, not what questions used
    before them (it kept the speculative ones, stored last)."""
    used = raw_entry(store, clock, range(0, 100))
    ahead = [raw_entry(store, clock, range(100 * i, 100 * i + 100), evict=False)
             for i in (1, 2)]
    clock.tick()
    store.longest_prefix(FP, range(200, 300))  # a question reads the second one
    store.budget_bytes = 3000
    newer = raw_entry(store, clock, range(300, 400))
    assert [e.id for e in store.entries()] == [used.id, ahead[1].id, newer.id]


def test_of_entries_stored_ahead_of_need_those_nothing_extends_go_first(store, clock):
    """The background pass stores the passages' shared head and the passages extending it
    alike ahead of need: evicting the head first took every passage with it, to free one
    passage's room."""
    head = raw_entry(store, clock, range(100), evict=False)
    passages = [raw_entry(store, clock, [*range(100), *range(1000 * i, 1000 * i + 100)],
                          parent_id=head.id, evict=False) for i in (1, 2, 3)]
    store.budget_bytes = 4000
    raw_entry(store, clock, range(5000, 5100))
    assert [e.id for e in store.entries()] == [head.id, *[p.id for p in passages[1:]],
                                               store.entries()[-1].id]


def test_room_is_not_made_by_evicting_what_the_writer_keeps(store, clock):
    """A question storing its passages keeps the others it reads: a passage that fits only
    without them is not stored, and nothing is evicted for it."""
    store.budget_bytes = 2500
    a, b = raw_entry(store, clock, range(0, 100)), raw_entry(store, clock, range(100, 200))
    clock.tick()
    with store.write_entry(FP, range(200, 300), levels=["raw"], keep=[a.id, b.id]) as writer:
        writer.put_chunk(0, "raw", bytes(1000))
    assert writer.evicted == [{"entry": writer.entry.id, "document_id": None, "chat_id": None,
                               "passage": False, "bytes": 1000, "model": FP,
                               "too_large": True, "beside": 2000}]
    assert [e.id for e in store.entries()] == [a.id, b.id]
    # Keeping one of them: the other, least recently used, goes instead.
    clock.tick()
    with store.write_entry(FP, range(200, 300), levels=["raw"], keep=[b.id]) as writer:
        writer.put_chunk(0, "raw", bytes(1000))
    assert [c["entry"] for c in writer.evicted] == [a.id]
    assert [e.id for e in store.entries()] == [b.id, writer.entry.id]


def test_entries_being_written_are_kept_until_abandoned(store, clock):
    root = raw_entry(store, clock, range(100))
    writer = store.write_entry(FP, range(200), levels=["raw"], parent_id=root.id)
    writer.put_chunk(0, "raw", bytes(500))
    report = store.gc(budget_bytes=0)
    assert report["evicted_entries"] == [] and report["abandoned_entries"] == []
    assert store.verify()["abandoned"] == []  # its writer is alive: not abandoned
    clock.now += ABANDON_AFTER_S + 1
    report = store.gc(budget_bytes=10_000)
    assert report["abandoned_entries"] == [writer.entry_id]
    assert report["freed_bytes"] == 500 and report["bytes_after"] == 1000
    with pytest.raises(LookupError):
        writer.put_chunk(0, "raw", bytes(500))


def test_an_entry_whose_writer_process_died_is_removed_at_once(store, clock):
    writer = store.write_entry(FP, range(100), levels=["raw"])
    writer.put_chunk(0, "raw", bytes(500))
    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute("UPDATE kv_entries SET writer_pid = ? WHERE id = ?",
                     (dead_pid(), writer.entry_id))
    conn.close()
    # `verify` names what the next `gc` removes
    assert store.verify()["abandoned"] == [{"entry": writer.entry_id, "bytes": 500}]
    assert store.gc()["abandoned_entries"] == [writer.entry_id]  # no 15 minutes' wait
    assert store.verify()["abandoned"] == []


def test_the_budget_defaults_to_ten_gigabytes(store, clock):
    raw_entry(store, clock, range(100))
    assert store.gc()["budget_bytes"] == 10 * 10**9
    assert store.gc()["evicted_entries"] == []


def test_a_document_whose_attach_was_killed_is_removed_unless_used(store, clock):
    """A killed attach's document is not passed off as one with no cache: gc removes it,
    or keeps it as attached when a chat is about it or its cache was stored."""
    lone, talked, cached, live = (
        store.add_document(name, name, name, type="text", attaching=True)
        for name in ("lone", "talked", "cached", "live"))
    store.create_chat("About it", [talked.id])
    raw_entry(store, clock, range(100), document_id=cached.id)
    assert store.attaching() == dict.fromkeys((lone.id, talked.id, cached.id, live.id), True)
    conn = sqlite3.connect(store.path)
    with conn:
        conn.execute("UPDATE documents SET attach_pid = ? WHERE id != ?", (dead_pid(), live.id))
    conn.close()
    assert store.attaching() == {lone.id: False, talked.id: False, cached.id: False,
                                 live.id: True}
    assert store.gc()["abandoned_documents"] == [lone.id]
    assert [d.id for d in store.documents()] == [talked.id, cached.id, live.id]
    assert store.attaching() == {live.id: True}  # this process's attach is under way
    store.finish_document(live.id)
    assert store.attaching() == {} and store.gc()["abandoned_documents"] == []
    assert store.document(live.id).attach_pid is None


def test_usage_says_where_the_bytes_go_by_model_and_kind(store, clock):
    """(`docs` added up to 12.8 MB where `gc` said 31.4 MB used: chats' and other models'
    caches were nowhere to be seen.)"""
    doc = store.add_document("h" * 64, "a.txt", "alpha", type="text")
    store.register_model("model-b", "/models/b.gguf", {"n_layer": 2})
    raw_entry(store, clock, range(0, 100), size=1000, document_id=doc.id)
    raw_entry(store, clock, range(100, 200), size=300)  # a shared prompt's
    clock.tick()
    with store.write_entry("model-b", range(200, 300), levels=["raw"],
                           document_id=doc.id) as writer:
        writer.put_chunk(0, "raw", bytes(700))
    assert store.usage_by_kind() == {FP: {"documents": 1000, "prompts": 300},
                                     "model-b": {"documents": 700}}
    assert sum(sum(k.values()) for k in store.usage_by_kind().values()) == store.usage_bytes()
