"""Helpers shared by the store tests (no tests here): a store on a tmp path, entries with
deterministic chunk bytes, an orphan census read straight from the database, and a store taken
back to the schema of an older kvdesk."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from store import Entry, Store
from store.documents.passages import M008_PASSAGES

FP = "model-a"
LEVELS = ("lossless", "compact")


def open_store(path: Path, **kwargs) -> Store:
    store = Store(path, **kwargs)
    store.register_model(FP, "/models/a.gguf", {"n_layer": 2})
    return store


def payload(start: int, end: int, level: str) -> bytes:
    """Chunk bytes that say which tokens and level they belong to, so mix-ups show."""
    return f"{level}:{start}:{end};".encode() * 8


def put_entry(store: Store, tokens, *, levels=LEVELS, fingerprint=FP, **kwargs) -> Entry:
    with store.write_entry(fingerprint, tokens, levels=levels, **kwargs) as writer:
        for span in writer.spans + writer.windows:
            for level in levels:
                writer.put_chunk(
                    span.chunk_index, level, payload(span.token_start, span.token_end, level)
                )
    return writer.entry


ORPHAN_QUERIES = {
    "chunks without span": "SELECT count(*) FROM kv_chunks c LEFT JOIN kv_spans s"
    " ON s.entry_id = c.entry_id AND s.chunk_index = c.chunk_index WHERE s.entry_id IS NULL",
    "spans without entry": "SELECT count(*) FROM kv_spans s LEFT JOIN kv_entries e"
    " ON e.id = s.entry_id WHERE e.id IS NULL",
    "entries without parent": "SELECT count(*) FROM kv_entries e LEFT JOIN kv_entries p"
    " ON p.id = e.parent_id WHERE e.parent_id IS NOT NULL AND p.id IS NULL",
    "entries without document": "SELECT count(*) FROM kv_entries e LEFT JOIN documents d"
    " ON d.id = e.document_id WHERE e.document_id IS NOT NULL AND d.id IS NULL",
    "entries without chat": "SELECT count(*) FROM kv_entries e LEFT JOIN chats c"
    " ON c.id = e.chat_id WHERE e.chat_id IS NOT NULL AND c.id IS NULL",
    "messages without chat": "SELECT count(*) FROM messages m LEFT JOIN chats c"
    " ON c.id = m.chat_id WHERE c.id IS NULL",
    "links without chat or document": "SELECT count(*) FROM chat_documents l"
    " LEFT JOIN chats c ON c.id = l.chat_id LEFT JOIN documents d ON d.id = l.document_id"
    " WHERE c.id IS NULL OR d.id IS NULL",
}


def orphans(store: Store) -> dict[str, int]:
    """Rows whose owner is gone, counted with foreign keys off (as a careless tool would see)."""
    conn = sqlite3.connect(store.path)
    try:
        counts = {name: conn.execute(sql).fetchone()[0] for name, sql in ORPHAN_QUERIES.items()}
    finally:
        conn.close()
    return {name: count for name, count in counts.items() if count}


def count(store: Store, table: str) -> int:
    conn = sqlite3.connect(store.path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


def dead_pid() -> int:
    """The id of a process that has exited."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)


def back_to_version_10(path: Path) -> None:
    """The store in folder `path`, as a kvdesk of schema version 10 (cc6482e) left it."""
    conn = sqlite3.connect(path / "kvdesk.sqlite")
    with conn:
        conn.execute("DELETE FROM migrations WHERE name IN ('m011_prompt_caches',"
                     " 'm012_entry_documents', 'm013_deleted_titles', 'm014_cjk_index')")
        for statement in ("DROP TRIGGER passages_fts_insert", "DROP TRIGGER passages_fts_delete",
                          "DROP TABLE passages_fts", "DROP VIEW passages_fts_source"):
            conn.execute(statement)
        # m008's index, as it was
        conn.executescript(M008_PASSAGES[M008_PASSAGES.index("CREATE VIRTUAL"):
                                         M008_PASSAGES.index("CREATE TABLE passage_vectors")])
        conn.execute("INSERT INTO passages_fts(passages_fts) VALUES ('rebuild')")
        conn.execute("DROP TABLE kv_entry_documents")
        conn.execute("DROP TRIGGER documents_take_what_holds_them")
        conn.execute("DROP TABLE deleted_documents")
        conn.execute("DROP TRIGGER documents_leave_their_titles")
        conn.execute("PRAGMA user_version = 10")
    conn.close()
