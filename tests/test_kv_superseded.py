"""A chat's entries that no later turn can resume from are dropped when its new context is
stored (`KVCache.drop_superseded`); what another chat, a document, a passage or an entry
extending one still needs is never touched. Store-level: no model."""

from __future__ import annotations

from test_store_helpers import FP, open_store, put_entry

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
