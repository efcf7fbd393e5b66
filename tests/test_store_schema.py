"""Schema migrations: from empty, from every earlier version, idempotent, refusing the unknown."""

from __future__ import annotations

import sqlite3

import pytest
from test_store_helpers import open_store, put_entry

from store import SchemaVersionError, Store
from store.db import open_connection
from store.schema import MIGRATIONS, SCHEMA_VERSION, migrate


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
    assert migrate(conn, target=version) == [name for name, _ in MIGRATIONS[:version]]
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
    with pytest.raises(SchemaVersionError, match="history"):
        Store(tmp_path)


def test_a_database_that_is_not_a_store_is_refused(tmp_path):
    conn = sqlite3.connect(tmp_path / "kvdesk.sqlite")
    conn.execute("CREATE TABLE notes (text)")
    conn.close()
    with pytest.raises(SchemaVersionError, match="not an empty file"):
        Store(tmp_path)
