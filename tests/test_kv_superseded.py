"""A chat's entries that no later turn can resume from are dropped when its new context is
stored (`KVCache.drop_superseded`); what another chat, a document, a passage or an entry
extending one (complete or still being written) still needs is never touched, and a store
error while dropping never fails the turn. Store-level: no model."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

from test_store_helpers import FP, LEVELS, open_store, payload, put_entry

from desktop_app.chat.exactness import Exactness
from desktop_app.chat.fairlock import ContextLock, FairLock
from desktop_app.kv.kvcache import KVCache


def test_a_chats_entries_it_can_no_longer_resume_from_are_dropped(tmp_path):
    store = open_store(tmp_path / "data")
    store.register_model("model-b", "/models/b.gguf", {"n_layer": 2})
    doc = store.add_document("d" * 64, "Guide", "text", type="text")
    mine, other = store.create_chat("mine"), store.create_chat("other")
    now = list(range(100, 200))  # what chat `mine` holds now
    before = [1, *range(101, 200)]  # an earlier turn's context, other passages blended in

    def chat_entry(tokens, chat=mine.id, **kw):
        return put_entry(store, tokens, chunk_size=16, chat_id=chat, **kw)

    old = chat_entry(before[:60])
    extended = chat_entry([2, *before[1:40]])  # ...from which another chat's goes on
    beyond = put_entry(store, [2, *before[1:50]], chunk_size=16, chat_id=other.id,
                       parent_id=extended.id)
    prefix = chat_entry(now[:32])  # a prefix of what it holds: resumable
    other_old = chat_entry(before[:70], chat=other.id)
    document = put_entry(store, before[:30], chunk_size=16, document_id=doc.id)
    passage = put_entry(store, [3, *before[1:20]], chunk_size=16, document_id=doc.id,
                        passage=True)
    another_model = chat_entry(before[:80], fingerprint="model-b")
    stored = chat_entry(now, parent_id=prefix.id)
    later = chat_entry(before[:90])  # stored after it (a turn meanwhile): not judged here

    KVCache(store, ("lossless",), 16, calibrations=None).drop_superseded(stored, mine.id, now)

    left = {e.id for e in store.entries()}
    assert old.id not in left
    assert {extended.id, beyond.id, prefix.id, other_old.id, document.id, passage.id,
            another_model.id, stored.id, later.id} <= left
    assert store.longest_prefix(FP, now, touch=False).n_tokens == len(now)
    store.close()


def test_an_entry_another_writer_is_extending_is_kept_and_that_writer_finishes(tmp_path):
    store = open_store(tmp_path / "data")
    mine, other = store.create_chat("mine"), store.create_chat("other")
    before, now = [1, *range(101, 200)], list(range(100, 200))
    old = put_entry(store, before[:48], chunk_size=16, chat_id=mine.id)
    # another chat's turn (or a local-API conversation, or another process) building on it
    with store.write_entry(FP, before[:96], levels=LEVELS, chunk_size=16, chat_id=other.id,
                           parent_id=old.id) as writer:
        stored = put_entry(store, now, chunk_size=16, chat_id=mine.id)
        KVCache(store, ("lossless",), 16, calibrations=None).drop_superseded(
            stored, mine.id, now)
        for span in writer.spans + writer.windows:
            for level in LEVELS:
                writer.put_chunk(span.chunk_index, level,
                                 payload(span.token_start, span.token_end, level))
    assert {old.id, writer.entry.id, stored.id} <= {e.id for e in store.entries()}
    assert store.longest_prefix(FP, before[:96], touch=False).n_tokens == 96
    store.close()


def test_dropping_reads_only_the_chats_entries_and_never_fails_the_turn(tmp_path, caplog):
    store = open_store(tmp_path / "data")
    mine, other = store.create_chat("mine"), store.create_chat("other")
    before, now = [1, *range(101, 200)], list(range(100, 200))
    old = put_entry(store, before[:48], chunk_size=16, chat_id=mine.id)
    elsewhere = put_entry(store, [5, *before[1:40]], chunk_size=16, chat_id=other.id)
    stored = put_entry(store, now, chunk_size=16, chat_id=mine.id)
    with sqlite3.connect(store.path) as conn:  # another chat's row damaged: never read here
        conn.execute("UPDATE kv_entries SET levels = '[' WHERE id = ?", (elsewhere.id,))
    cache = KVCache(store, ("lossless",), 16, calibrations=None)
    cache.drop_superseded(stored, mine.id, now)
    assert store.damage is None
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("SELECT id FROM kv_entries WHERE id = ?", (old.id,)).fetchone() is None
    again = put_entry(store, before[:32], chunk_size=16, chat_id=mine.id)
    with sqlite3.connect(store.path) as conn:  # this chat's own: logged, the turn goes on
        conn.execute("UPDATE kv_entries SET levels = '[' WHERE id = ?", (again.id,))
    newer = put_entry(store, [*now, 7], chunk_size=16, chat_id=mine.id)
    cache.drop_superseded(newer, mine.id, [*now, 7])
    assert "superseded caches are not dropped" in caplog.text
    store.close()


class _Runtime:
    fingerprint = FP
    layout = SimpleNamespace(swa_layers=())

    def reset(self):
        pass

    def prefill(self, tokens, **kw):
        pass


def _exactness_pass(store, rt, conversation):
    cache = KVCache(store, ("lossless",), 16, calibrations=None)
    cache.store_prefix = lambda rt, tokens, chat_id=None, **kw: put_entry(
        store, tokens, chunk_size=16, chat_id=chat_id)
    return Exactness(SimpleNamespace(get=lambda name: rt), cache, chat_lock=FairLock(),
                     attach_lock=ContextLock(), conversation=conversation,
                     documents=lambda c: [], first_document=lambda rt, c: None,
                     prefix=None, on_exact=lambda c: None)


def test_the_exactness_pass_never_drops_the_chats_newer_turn(tmp_path):
    """The pass stores an older context than a turn stored meanwhile (whose entry can even be
    dated before the pass's): the chat no longer starts with what the pass stored, so the
    pass judges none of its entries superseded."""
    store = open_store(tmp_path / "data")
    chat = store.create_chat("mine")
    exact, turn = [1, *range(101, 140)], list(range(100, 200))  # (passages re-blended since)
    newest = put_entry(store, turn, chunk_size=16, chat_id=chat.id)
    # (computed from `exact`, stored as it; by then the chat's turn had re-blended it)
    now = iter([exact, exact, turn])
    _exactness_pass(store, _Runtime(), lambda rt, c: ([], next(now), [])).work(chat.id)
    left = {e.id for e in store.entries()}
    assert newest.id in left
    assert store.longest_prefix(FP, exact, touch=False).n_tokens == len(exact)
    store.close()


def test_the_exactness_pass_drops_the_copies_a_blended_chat_left(tmp_path):
    """A chat over a long document stores nothing at its blended turns: the pass stores each
    turn's exact context, and found 7 entries after 6 turns (a probe). The chat still starts
    with what it stored: the earlier turns' contexts, no prefix of it, are dropped."""
    store = open_store(tmp_path / "data")
    chat = store.create_chat("mine")
    older = [put_entry(store, [1, *range(200 + 40 * i, 240 + 40 * i)], chunk_size=16,
                       chat_id=chat.id) for i in range(3)]
    exact = [1, *range(101, 140)]
    _exactness_pass(store, _Runtime(), lambda rt, c: ([], exact, [])).work(chat.id)
    left = {e.id for e in store.entries()}
    assert not left & {e.id for e in older}
    assert store.longest_prefix(FP, exact, touch=False).n_tokens == len(exact)
    store.close()
