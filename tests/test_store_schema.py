"""Schema migrations: from empty, from every earlier version, idempotent, refusing the unknown."""

from __future__ import annotations

import hashlib
import sqlite3
import zlib

import pytest
from test_store_helpers import back_to_version_10, count, open_store, orphans, put_entry

from store import CorruptChunkError, SchemaVersionError, Store, upgrade
from store.datadir.db import open_connection
from store.schema import MIGRATIONS, SCHEMA_VERSION
from store.upgrade import migrate


def test_new_store_is_at_latest_version_in_wal_with_incremental_vacuum(tmp_path):
    with Store(tmp_path) as store:
        assert store.schema_version == SCHEMA_VERSION
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    names = [row[0] for row in conn.execute("SELECT name FROM migrations ORDER BY rowid")]
    assert names == [name for name, _ in MIGRATIONS]


@pytest.mark.parametrize("version", range(SCHEMA_VERSION + 1))
def test_upgrade_from_every_version(tmp_path, version):
    conn = open_connection(tmp_path / "kvdesk.sqlite")
    assert migrate(conn, target=version).applied == [name for name, _ in MIGRATIONS[:version]]
    conn.close()
    with open_store(tmp_path) as store:
        assert store.schema_version == SCHEMA_VERSION
        document = store.add_document("h", "Doc", "text", type="txt")
        entry = put_entry(store, range(300), document_id=document.id)
        match = store.longest_prefix("model-a", range(400))
        assert [e.id for e in match.entries] == [entry.id]


def test_reopening_is_idempotent_and_keeps_data(tmp_path):
    with open_store(tmp_path) as store:
        entry = put_entry(store, range(600))
        chat = store.create_chat("hello")
        store.add_message(chat.id, "user", "hi")
    for _ in range(2):
        with Store(tmp_path) as store:
            assert store.schema_version == SCHEMA_VERSION
            assert store.entry(entry.id) == entry
            assert [m.text for m in store.messages(chat.id)] == ["hi"]


def test_a_newer_schema_is_refused_untouched(tmp_path):
    Store(tmp_path).close()
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaVersionError, match="newer than this kvdesk"):
        Store(tmp_path)
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1


def test_a_foreign_migration_history_is_refused(tmp_path):
    Store(tmp_path).close()
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    conn.execute("UPDATE migrations SET name = 'm001_someone_elses' WHERE name = 'm001_initial'")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaVersionError) as refused:
        Store(tmp_path)
    # In words, with no list of names to decode: what the file is, untouched, what to do
    assert str(refused.value) == (
        f"{tmp_path / 'kvdesk.sqlite'} was written by a kvdesk build this one cannot read: its "
        "schema has steps this kvdesk does not know (m001_someone_elses). Nothing in it was "
        "changed. Open it with the kvdesk that last used it (`kvdesk export` there saves a chat "
        "as a file), or choose another data directory")


def _schema(path) -> set[tuple]:
    conn = sqlite3.connect(path)
    try:
        return set(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
    finally:
        conn.close()


def test_a_history_lacking_a_migration_safe_to_apply_late_is_completed(tmp_path):
    """kvdesk 7599da0 and 9751386 wrote stores with m008 and m009 but no m007 (which came back
    before them): m007 is applied after them, giving the schema a straight upgrade gives, and
    the history becomes ours; the store's rows stay."""
    conn = open_connection(tmp_path / "kvdesk.sqlite")
    conn.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied REAL)")
    theirs = [m for m in MIGRATIONS[:9] if m[0] != "m007_attaching"]
    for name, apply in theirs:
        apply(conn)
        conn.execute("INSERT INTO migrations VALUES (?, 1.0)", (name,))
    conn.execute(f"PRAGMA user_version = {len(theirs)}")
    conn.execute("INSERT INTO documents (content_hash, title, type, text, created)"
                 " VALUES ('h', 'Kept', 'txt', 'text', 0)")
    conn.commit()
    conn.close()
    with open_store(tmp_path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert [d.title for d in store.documents()] == ["Kept"]
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    rows = conn.execute("SELECT name, applied FROM migrations ORDER BY rowid").fetchall()
    conn.close()
    assert [name for name, _ in rows] == [name for name, _ in MIGRATIONS]
    assert [when for name, when in rows if name in dict(theirs)] == [1.0] * len(theirs)
    Store(tmp_path / "straight").close()
    assert _schema(tmp_path / "kvdesk.sqlite") == _schema(tmp_path / "straight/kvdesk.sqlite")


def test_a_history_lacking_a_migration_not_safe_to_apply_late_is_refused(tmp_path):
    conn = open_connection(tmp_path / "kvdesk.sqlite")
    migrate(conn, target=6)
    conn.execute("DELETE FROM migrations WHERE name = 'm005_windows'")
    conn.execute("PRAGMA user_version = 5")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaVersionError, match="in another order, or with some missing"):
        Store(tmp_path)
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 5


def test_a_database_that_is_not_a_store_is_refused(tmp_path):
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    conn.execute("CREATE TABLE notes (text)")
    conn.close()
    with pytest.raises(SchemaVersionError, match="not an empty file"):
        Store(tmp_path)


@pytest.mark.parametrize("version", [3, SCHEMA_VERSION + 1])
def test_another_programs_database_with_a_schema_version_is_not_called_a_kvdesk_store(
        tmp_path, version):
    """A version but no history of kvdesk's steps: another program's, whatever its version."""
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    conn.execute("CREATE TABLE notes (x)")
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    with pytest.raises(SchemaVersionError, match="is not a kvdesk store .another program's"):
        Store(tmp_path)
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == version
    assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("notes",)]


def test_message_tokens_move_out_of_the_stats(tmp_path):
    """m002: tokens kept in a message's stats JSON go to message_tokens under the model of the
    chat's newest entry, else the store's only model; with neither they are dropped."""
    conn = open_connection(tmp_path / "kvdesk.sqlite")
    migrate(conn, target=1)
    conn.execute("INSERT INTO models VALUES ('fp-a', '/a.gguf', '{}', 0)")
    for chat_id in (1, 2):
        conn.execute("INSERT INTO chats VALUES (?, 'c', 0, 0)", (chat_id,))
    conn.execute("INSERT INTO messages VALUES (1, 1, 'user', 'q', ?, 0, 0)",
                 ('{"tokens": [5, 6]}',))
    conn.execute("INSERT INTO messages VALUES (2, 1, 'assistant', 'a', ?, 0, 0)",
                 ('{"ttft_s": 0.5, "tokens": [7]}',))
    conn.execute("INSERT INTO messages VALUES (3, 2, 'user', 'q', NULL, 0, 0)")
    conn.commit()
    conn.close()
    with Store(tmp_path) as store:
        assert store.message_tokens(1, "fp-a") == {1: [5, 6], 2: [7]}
        assert [m.stats for m in store.messages(1)] == [None, {"ttft_s": 0.5}]

    # Two models: chat 1 has no entry naming one, so its tokens go; chat 2's entry names one.
    conn = open_connection(tmp_path / "other.sqlite")
    migrate(conn, target=1)
    conn.execute("INSERT INTO models VALUES ('fp-a', '/a.gguf', '{}', 0)")
    conn.execute("INSERT INTO models VALUES ('fp-b', '/b.gguf', '{}', 0)")
    conn.execute("INSERT INTO chats VALUES (1, 'c', 0, 0)")
    conn.execute("INSERT INTO messages VALUES (1, 1, 'user', 'q', ?, 0, 0)",
                 ('{"tokens": [5]}',))
    conn.execute("INSERT INTO chats VALUES (2, 'c', 0, 0)")
    conn.execute("INSERT INTO messages VALUES (2, 2, 'user', 'q', ?, 0, 0)",
                 ('{"tokens": [8]}',))
    conn.execute("INSERT INTO kv_entries (model, prefix_hash, token_start, token_end,"
                 " chunk_size, levels, tokens, chat_id, complete, last_used, created)"
                 " VALUES ('fp-b', x'00', 0, 1, 256, '[]', x'08000000', 2, 1, 0, 0)")
    conn.commit()
    migrate(conn)
    assert conn.execute("SELECT message_id, model FROM message_tokens").fetchall() == [
        (2, "fp-b")]
    assert conn.execute("SELECT stats FROM messages WHERE id = 1").fetchone()[0] is None
    conn.close()


def test_document_and_chat_ids_are_never_reused(tmp_path):
    with open_store(tmp_path) as store:
        docs = [store.add_document(f"h{i}", f"D{i}", "t", type="txt").id for i in range(2)]
        chats = [store.create_chat(f"c{i}", [docs[0]]).id for i in range(2)]
        store.delete_document(docs[1])
        store.delete_chat(chats[1])
        assert store.add_document("h9", "D9", "t", type="txt").id == docs[1] + 1
        assert store.create_chat("c9").id == chats[1] + 1


def test_m003_keeps_every_row_and_what_refers_to_it(tmp_path):
    """The documents and chats tables are rebuilt; rows pointing at them survive, and the
    cascades still work afterwards."""
    conn = open_connection(tmp_path / "old.sqlite")
    migrate(conn, target=2)
    conn.execute("INSERT INTO models VALUES ('model-a', '/a.gguf', '{}', 0)")
    conn.execute("INSERT INTO documents VALUES (5, 'h', 'Doc', NULL, 'txt', 'text', 3, 0)")
    conn.execute("INSERT INTO chats VALUES (7, 'c', 0, 0)")
    conn.execute("INSERT INTO chat_documents VALUES (7, 5, 0)")
    conn.execute("INSERT INTO messages VALUES (1, 7, 'user', 'q', NULL, 0, 0)")
    conn.execute("INSERT INTO kv_entries (model, prefix_hash, token_start, token_end,"
                 " chunk_size, levels, tokens, document_id, complete, last_used, created)"
                 " VALUES ('model-a', x'00', 0, 1, 256, '[]', x'01000000', 5, 1, 0, 0)")
    conn.commit()
    migrate(conn)
    assert conn.execute("SELECT id, title FROM documents").fetchall() == [(5, "Doc")]
    assert conn.execute("SELECT count(*) FROM chat_documents").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    conn.execute("DELETE FROM documents WHERE id = 5")
    assert conn.execute("SELECT count(*) FROM kv_entries").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM chat_documents").fetchone()[0] == 0
    conn.execute("DELETE FROM chats WHERE id = 7")
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    conn.close()


def test_m006_seals_every_chunk_to_its_place(tmp_path):
    """Rows hashed by their bytes alone (m003 to m005) and rows with a CRC-32 only (before
    m003) keep reading as they did, and can no longer be moved unnoticed; a CRC-only row that
    fails its CRC is quarantined."""
    conn = open_connection(tmp_path / "kvdesk.sqlite")
    migrate(conn, target=5)
    conn.execute("INSERT INTO models VALUES ('model-a', '/a.gguf', '{}', 0)")
    conn.execute("INSERT INTO documents (id, content_hash, title, type, text, created)"
                 " VALUES (1, 'h', 'Doc', 'txt', 'text', 0)")  # (not prompt caches: m011)
    data = {(e, c): f"entry {e} chunk {c};".encode() * 50 for e in (1, 2) for c in (0, 1)}
    for e in (1, 2):
        conn.execute("INSERT INTO kv_entries (id, model, prefix_hash, token_start, token_end,"
                     " chunk_size, levels, tokens, complete, last_used, created, document_id)"
                     " VALUES (?, 'model-a', ?, 0, 4, 2, '[\"x\"]', ?, 1, 0, 0, 1)",
                     (e, bytes([e]) * 16, bytes(16)))
        for c in (0, 1):
            conn.execute("INSERT INTO kv_spans VALUES (?, ?, ?, ?, ?, 0)",
                         (e, c, 2 * c, 2 * c + 2, bytes([e, c]) * 8))
            blob = data[e, c]
            crc = zlib.crc32(blob) ^ (1 if (e, c) == (2, 1) else 0)  # (2, 1): rotten
            sha = hashlib.sha256(blob).digest() if c == 0 else None  # chunk 1: before m003
            conn.execute("INSERT INTO kv_chunks (entry_id, chunk_index, level, nbytes,"
                         " checksum, data, sha256) VALUES (?, ?, 'x', ?, ?, ?, ?)",
                         (e, c, len(blob), crc, blob, sha))
    conn.close()
    with Store(tmp_path) as store:
        assert store.schema_version == SCHEMA_VERSION
        for e, c in [(1, 0), (1, 1), (2, 0)]:
            assert store.read_chunk(e, c, "x") == data[e, c]
        assert store.quarantined() == [(2, 1, "x")]
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    q = "SELECT nbytes, sha256, data FROM kv_chunks WHERE entry_id = ? AND chunk_index = ?"
    first, second = conn.execute(q, (1, 0)).fetchone(), conn.execute(q, (2, 0)).fetchone()
    u = "UPDATE kv_chunks SET nbytes = ?, sha256 = ?, data = ? WHERE entry_id = ? AND" \
        " chunk_index = ?"
    with conn:
        conn.execute(u, (*second, 1, 0))
        conn.execute(u, (*first, 2, 0))
    conn.close()
    with Store(tmp_path) as store:
        for e in (1, 2):
            with pytest.raises(CorruptChunkError):
                store.read_chunk(e, 0, "x")
        assert store.read_chunk(1, 1, "x") == data[1, 1]


def test_m011_drops_the_prompt_caches_and_what_extends_them_and_keeps_the_rest(tmp_path):
    """A prompt cache stored before m011 may hold lossy KV under every level's name."""
    with open_store(tmp_path) as store:
        doc = store.add_document("h", "Doc", "text", type="txt")
        chat = store.create_chat("About it", [doc.id])
        kept = put_entry(store, range(300), document_id=doc.id)
        chat_entry = put_entry(store, range(400), parent_id=kept.id, chat_id=chat.id)
        passage = put_entry(store, range(1000, 1200), document_id=doc.id, passage=True)
        prompt = put_entry(store, range(500, 800))
        put_entry(store, range(500, 900), parent_id=prompt.id)
    back_to_version_10(tmp_path)
    with open_store(tmp_path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert sorted(e.id for e in store.entries()) == sorted(
            [kept.id, chat_entry.id, passage.id])
        assert orphans(store) == {}
        assert count(store, "kv_spans") == sum(e.n_chunks for e in store.entries())
        # Said once, where the app shows it as the store opens
        assert store.upgrade_notes == [
            "2 cached prompts of the local API (stored /v1/responses conversations' KV among "
            "them) made by an older kvdesk were dropped: each is computed again at its next use"]
    with open_store(tmp_path) as store:
        assert store.upgrade_notes == []


def test_m011_counts_the_prompt_caches_that_extend_a_documents_entry(tmp_path):
    """Prompt caches stored as children of a document's entry (the same prefix) are dropped
    too, and said: none is dropped unsaid."""
    with open_store(tmp_path) as store:
        doc = store.add_document("h", "Doc", "text", type="txt")
        kept = put_entry(store, range(300), document_id=doc.id)
        put_entry(store, range(400), parent_id=kept.id)
        put_entry(store, range(500), parent_id=kept.id)
    back_to_version_10(tmp_path)
    with open_store(tmp_path) as store:
        assert [e.id for e in store.entries()] == [kept.id]
        assert store.upgrade_notes == [
            "2 cached prompts of the local API (stored /v1/responses conversations' KV among "
            "them) made by an older kvdesk were dropped: each is computed again at its next use"]


def test_an_upgrade_stopped_after_dropping_caches_says_so_at_the_next_open(tmp_path, monkeypatch):
    """m011 commits on its own: its note is kept with it, said by the open that finishes."""
    with open_store(tmp_path) as store:
        put_entry(store, range(500, 800))
    back_to_version_10(tmp_path)

    def stopped(conn):
        raise KeyboardInterrupt  # (a later migration failing, a crash, Ctrl-C)

    monkeypatch.setattr(upgrade, "MIGRATIONS", [*MIGRATIONS[:11], (MIGRATIONS[11][0], stopped),
                                                *MIGRATIONS[12:]])
    with pytest.raises(KeyboardInterrupt):
        Store(tmp_path)
    monkeypatch.undo()
    with open_store(tmp_path) as store:
        assert store.upgrade_notes == [
            "1 cached prompt of the local API (stored /v1/responses conversations' KV among "
            "them) made by an older kvdesk was dropped: each is computed again at its next use"]
        assert store.setting(upgrade.NOTES) is None
    with open_store(tmp_path) as store:
        assert store.upgrade_notes == []
