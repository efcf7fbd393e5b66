"""Documents, chats, messages, links and settings; deletes leave no orphans behind."""

from __future__ import annotations

import pytest
from test_store_helpers import count, open_store, orphans, payload, put_entry

from store import NotFoundError


@pytest.fixture
def store(tmp_path):
    with open_store(tmp_path) as store:
        yield store


def test_same_content_hash_returns_the_stored_document(store):
    first = store.add_document("sha-1", "Report", "text", type="pdf", source_path="/a.pdf")
    again = store.add_document("sha-1", "Report (copy)", "text", type="pdf", source_path="/b.pdf")
    assert again == first
    assert store.documents() == [first]


def test_a_document_entry_is_reused_per_model(store):
    document = store.add_document("sha-1", "Report", "text", type="txt", n_tokens=700)
    assert store.document_entry(document.id, "model-a") is None
    entry = put_entry(store, range(700), document_id=document.id)
    assert store.document_entry(document.id, "model-a").id == entry.id
    store.register_model("model-b", "/models/b.gguf", {})
    assert store.document_entry(document.id, "model-b") is None


def test_chats_messages_and_links(store):
    a = store.add_document("a", "A", "alpha", type="txt")
    b = store.add_document("b", "B", "beta", type="txt")
    chat = store.create_chat("About A", [a.id])
    store.attach_document(chat.id, b.id)
    store.attach_document(chat.id, a.id)
    assert [d.id for d in store.chat_documents(chat.id)] == [a.id, b.id]
    question = store.add_message(chat.id, "user", "What is A?")
    answer = store.add_message(chat.id, "assistant", "")
    answer = store.update_message(answer.id, text="Alpha.", stats={"tokens_per_s": 42.0})
    assert [(m.role, m.text) for m in store.messages(chat.id)] == [
        ("user", "What is A?"),
        ("assistant", "Alpha."),
    ]
    assert store.message(answer.id).stats == {"tokens_per_s": 42.0}
    assert question.stats is None
    store.create_chat("Other")
    store.rename_chat(chat.id, "About A and B")
    assert [c.title for c in store.chats()] == ["About A and B", "Other"]
    with pytest.raises(NotFoundError):
        store.add_message(12345, "user", "lost")


def test_settings_round_trip_json(store):
    assert store.setting("ui.theme", "light") == "light"
    store.set_setting("ui.theme", {"name": "dark", "contrast": 1.5})
    store.set_setting("ui.theme", {"name": "dark", "contrast": 2})
    assert store.setting("ui.theme") == {"name": "dark", "contrast": 2}
    assert store.budget_bytes == 10 * 10**9
    store.budget_bytes = 123
    assert store.budget_bytes == 123


def test_deleting_a_document_removes_its_caches_and_links_only(store):
    document = store.add_document("a", "A", "alpha", type="txt")
    kept = store.add_document("b", "B", "beta", type="txt")
    chat = store.create_chat("chat", [document.id, kept.id])
    store.add_message(chat.id, "user", "hi")
    root = put_entry(store, range(600), document_id=document.id)
    put_entry(store, range(900), parent_id=root.id, chat_id=chat.id)
    kept_entry = put_entry(store, range(5000, 5300), document_id=kept.id)
    store.delete_document(document.id)
    assert [e.id for e in store.entries()] == [kept_entry.id]
    assert [d.id for d in store.chat_documents(chat.id)] == [kept.id]
    assert [m.text for m in store.messages(chat.id)] == ["hi"]
    assert store.usage_bytes() == kept_entry.nbytes
    assert orphans(store) == {}
    with pytest.raises(NotFoundError):
        store.delete_document(document.id)
    # its title stays for the chat's notes and sources; a document no chat was about leaves none
    alone = store.add_document("c", "C", "gamma", type="txt")
    store.delete_document(alone.id)
    assert store.deleted_titles() == {document.id: "A"}
    assert store.document_titles() == {kept.id: "B"}
    store.delete_chat(chat.id)  # and it goes with the last chat that was about it
    assert store.deleted_titles() == {}


def test_deleting_a_later_document_of_a_chat_removes_the_chats_caches_holding_it(store):
    """A chat over [A, D, B] extends A's entry: D's KV is in the chat's own entries (and those
    extending them), which can never be read again once the chat goes on without D."""
    a, d, b = (store.add_document(h, h.upper(), h, type="txt") for h in ("a", "d", "b"))
    chat = store.create_chat("three", [a.id, d.id, b.id])
    other = store.create_chat("A and B", [a.id, b.id])
    store.add_message(chat.id, "user", "hi")
    a_root = put_entry(store, range(600), document_id=a.id)
    b_root = put_entry(store, range(5000, 5300), document_id=b.id)
    mine = put_entry(store, range(1700), parent_id=a_root.id, chat_id=chat.id)
    put_entry(store, range(2000), parent_id=mine.id)  # a prompt's, extending the chat's
    others = put_entry(store, [*range(600), *range(3000, 3700)], parent_id=a_root.id,
                       chat_id=other.id)
    before = store.usage_bytes()
    store.delete_document(d.id)
    assert sorted(e.id for e in store.entries()) == sorted([a_root.id, b_root.id, others.id])
    assert store.usage_bytes() < before
    assert [m.text for m in store.messages(chat.id)] == ["hi"]
    assert [x.id for x in store.chat_documents(chat.id)] == [a.id, b.id]
    assert orphans(store) == {}
    assert store.gc(budget_bytes=10**12)["freed_bytes"] == 0


def test_an_entry_holding_a_document_goes_with_it_and_is_never_written_after_it(store):
    """A conversation's entry over [A, D] names no chat: it goes with D because it says it
    holds D, even while still being written, whatever deletes D (a killed attach's leftovers
    too); once D is gone, no entry holding it starts."""
    a, d, left = (store.add_document(h, h.upper(), h, type="txt") for h in ("a", "d", "l"))
    a_root = put_entry(store, range(600), document_id=a.id)
    held = put_entry(store, range(1700), parent_id=a_root.id, holds=[d.id])
    put_entry(store, range(2000), parent_id=held.id)  # a later turn's, extending it
    writer = store.write_entry("model-a", range(1800), levels=["raw"], parent_id=a_root.id,
                               holds=[a.id, d.id])
    store.delete_document(d.id)
    assert [e.id for e in store.entries()] == [a_root.id]
    put_entry(store, range(1600), parent_id=a_root.id, holds=[left.id])
    with store._db.write() as db:  # (as gc drops an unfinished document: no library call)
        db.execute("DELETE FROM documents WHERE id = ?", (left.id,))
    assert [e.id for e in store.entries()] == [a_root.id]
    chat = store.create_chat("About A", [a.id])
    with pytest.raises(NotFoundError, match="removed while being written"):
        writer.put_chunk(writer.spans[0].chunk_index, "raw", b"kv")
    with pytest.raises(NotFoundError, match="document .* is deleted"):
        store.write_entry("model-a", range(1900), levels=["raw"], parent_id=a_root.id,
                          holds=[a.id, d.id])
    assert count(store, "kv_entry_documents") == 0
    # Nor one of a deleted document or chat: said, never a raw foreign-key error
    with pytest.raises(NotFoundError, match="document .* is deleted"):
        store.write_entry("model-a", range(100), levels=["raw"], document_id=d.id)
    store.delete_chat(chat.id)
    with pytest.raises(NotFoundError, match="chat .* is deleted"):
        store.write_entry("model-a", range(100), levels=["raw"], chat_id=chat.id)
    assert orphans(store) == {}


def test_deleting_a_chat_removes_messages_links_and_its_caches(store):
    document = store.add_document("a", "A", "alpha", type="txt")
    chat = store.create_chat("chat", [document.id])
    store.add_message(chat.id, "user", "hi")
    root = put_entry(store, range(600), document_id=document.id)
    put_entry(store, range(900), parent_id=root.id, chat_id=chat.id)
    store.delete_chat(chat.id)
    assert [e.id for e in store.entries()] == [root.id]
    assert store.chats() == []
    assert store.documents() == [document]
    for table in ("messages", "chat_documents", "kv_spans"):
        assert count(store, table) == (3 if table == "kv_spans" else 0)
    assert orphans(store) == {}


def test_deletes_hand_space_back_to_the_file_system(store):
    document = store.add_document("a", "A", "alpha", type="txt")
    with store.write_entry("model-a", range(512), levels=["raw"], document_id=document.id) as w:
        for span in w.spans:
            w.put_chunk(span.chunk_index, "raw", bytes(2_000_000))
    store._db.get().conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    full = store.path.stat().st_size
    store.delete_document(document.id)
    store._db.get().conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert store.path.stat().st_size < full - 3_500_000


def test_message_tokens_are_kept_per_model(store):
    store.register_model("model-b", "/models/b.gguf", {})
    chat = store.create_chat("c")
    q = store.add_message(chat.id, "user", "hi", tokens=[1, 2, 3], model="model-a")
    a = store.add_message(chat.id, "assistant", "hello")
    assert store.message_tokens(chat.id, "model-a") == {q.id: [1, 2, 3]}
    assert store.message_tokens(chat.id, "model-b") == {}
    store.set_message_tokens(a.id, "model-b", [9])
    store.set_message_tokens(q.id, "model-b", [7, 8])
    assert store.message_tokens(chat.id, "model-b") == {q.id: [7, 8], a.id: [9]}
    with pytest.raises(NotFoundError):
        store.set_message_tokens(a.id, "no-such-model", [1])
    with pytest.raises(ValueError, match="model"):
        store.add_message(chat.id, "user", "x", tokens=[1])
    store.add_turn(chat.id, "hi?", "hello!", model="model-a", question_tokens=[4],
                   answer_tokens=[5], replacing=[q.id])  # a replaced message's tokens go too
    assert store.message_tokens(chat.id, "model-b") == {a.id: [9]}
    store.delete_chat(chat.id)
    assert count(store, "message_tokens") == 0


def test_a_replaced_turn_goes_only_with_its_replacement(store):
    """A regenerated turn is removed in the transaction that stores the new one: a write that
    fails leaves the old turn as it was."""
    chat = store.create_chat("c")
    turn = dict(model="model-a", question_tokens=[1], answer_tokens=[2])
    store.add_turn(chat.id, "q", "first answer", **turn)
    old = [m.id for m in store.messages(chat.id)]
    with pytest.raises(NotFoundError):  # one of the messages it replaces is not there
        store.add_turn(chat.id, "q", "second answer", **turn, replacing=[*old, 10_000])
    assert [m.text for m in store.messages(chat.id)] == ["q", "first answer"]
    store.add_turn(chat.id, "q", "second answer", **turn, replacing=old)
    assert [m.text for m in store.messages(chat.id)] == ["q", "second answer"]


def test_listing_aggregates(store):
    a = store.add_document("a", "A", "alpha", type="txt")
    b = store.add_document("b", "B", "beta", type="txt")
    one = store.create_chat("one", [b.id, a.id])
    two = store.create_chat("two")
    for text in ("q", "a", "q2"):
        store.add_message(one.id, "user", text)
    assert store.message_counts() == {one.id: 3}
    assert store.chat_document_ids() == {one.id: [b.id, a.id]}
    assert two.id not in store.chat_document_ids()


def test_level_bytes_of_entries_and_spans(store):
    entry = put_entry(store, range(600), chunk_size=256)
    per_entry = store.entry_level_bytes([entry.id])[entry.id]
    spans = store.longest_prefix("model-a", range(600)).spans
    assert len(spans) == 3
    assert store.level_bytes(spans) == per_entry
    assert per_entry == {lvl: sum(len(payload(s.token_start, s.token_end, lvl)) for s in spans)
                         for lvl in ("lossless", "compact")}
    first_two = store.level_bytes(spans[:2])
    assert first_two["compact"] == sum(len(payload(s.token_start, s.token_end, "compact"))
                                       for s in spans[:2])
    assert store.level_bytes([]) == {} and store.entry_level_bytes([]) == {}


def test_a_new_chat_is_stored_with_its_first_turn_or_not_at_all(store):
    doc = store.add_document("a", "A", "alpha", type="txt")
    turn = dict(stats={"ttft_s": 0.1}, model="model-a", question_tokens=[1, 2],
                answer_tokens=[3])
    with pytest.raises(NotFoundError):  # a document gone meanwhile: nothing is stored
        store.start_chat("Why?", [doc.id, 999], "Why?", "Because.", **turn)
    assert store.chats() == [] and count(store, "messages") == 0
    chat = store.start_chat("Why?", [doc.id], "Why?", "Because.", **turn)
    assert [d.id for d in store.chat_documents(chat.id)] == [doc.id]
    assert [(m.role, m.text) for m in store.messages(chat.id)] == [("user", "Why?"),
                                                                  ("assistant", "Because.")]
    assert store.messages(chat.id)[1].stats == {"ttft_s": 0.1}
    assert sorted(store.message_tokens(chat.id, "model-a").values()) == [[1, 2], [3]]


def test_a_deleted_documents_passage_words_leave_the_file(store):
    """(After `rm`, the full-text index's old segments still held the document's words, with
    their positions, in the database file: FTS5 records a deletion as a mark.)"""
    docs = {word: store.add_document(word, word, "x", type="text").id
            for word in ("ordinaryword", "pangolinsonata")}
    for word, doc_id in docs.items():
        with store._db.write() as w:
            for i in range(300):
                w.execute("INSERT INTO passages (document_id, idx, text, char_start, char_end,"
                          " line_start, line_end, heading, n_tokens, content_hash)"
                          " VALUES (?, ?, ?, 0, 1, 1, 1, '[]', 5, ?)",
                          (doc_id, i, f"Clause {i} of the {word} agreement, beta {i * 7}.",
                           f"{doc_id}-{i}"))
    store.delete_document(docs["pangolinsonata"])
    store._db.get().conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = b"".join(p.read_bytes() for p in store.path.parent.glob("kvdesk.sqlite*"))
    assert raw.count(b"pangolinsonata") == 0 and raw.count(b"ordinaryword") >= 300
    assert len(store.search_passages(docs["ordinaryword"], "ordinaryword", 5)) == 5
