"""Documents, chats, messages, links and settings; deletes leave no orphans behind."""

from __future__ import annotations

import pytest
from test_store_helpers import count, open_store, orphans, put_entry

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
