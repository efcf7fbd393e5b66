"""The store's schema: an ordered list of named migrations (store.upgrade applies them).

Never edit or reorder a released migration; append a new one. A migration returns None, or, where
it drops something users had, a sentence saying what (the app says it once, as the store opens).

Token ranges live in kv_spans (one row per chunk boundary of an entry, shared by all of its levels;
since m004 also one per part of its window, if it has one); kv_chunks holds one row per (entry,
chunk, level) with the bytes, so reading a chunk never loads the rest of its entry, and (since
m006) a seal binding them to that place (store.caches.blobs).
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Callable

from .caches import blobs
from .datadir.db import execute_script
from .documents.passages import m008_passages, m014_cjk_index
from .tokens import encode as encode_tokens

M001_INITIAL = """
CREATE TABLE models (
    fingerprint TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    layout TEXT NOT NULL,               -- JSON: layer count, heads, head size, dtype...
    created REAL NOT NULL
);
CREATE TABLE documents (
    id INTEGER PRIMARY KEY,
    content_hash TEXT NOT NULL UNIQUE,
    title TEXT NOT NULL,
    source_path TEXT,
    type TEXT NOT NULL,
    text TEXT NOT NULL,
    n_tokens INTEGER,
    created REAL NOT NULL
);
CREATE TABLE chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE chat_documents (
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    document_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    PRIMARY KEY (chat_id, document_id)
) WITHOUT ROWID;
CREATE INDEX chat_documents_document ON chat_documents(document_id);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    text TEXT NOT NULL,
    stats TEXT,                         -- JSON: how the answer was made (time to first token...)
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX messages_chat ON messages(chat_id, id);
CREATE TABLE kv_entries (
    id INTEGER PRIMARY KEY,
    model TEXT NOT NULL REFERENCES models(fingerprint) ON DELETE CASCADE,
    prefix_hash BLOB NOT NULL,          -- store.tokens.prefix_hashes of tokens[0:token_end]
    token_start INTEGER NOT NULL,       -- = parent's token_end, 0 for a root entry
    token_end INTEGER NOT NULL,
    parent_id INTEGER REFERENCES kv_entries(id) ON DELETE CASCADE,
    chunk_size INTEGER NOT NULL,
    levels TEXT NOT NULL,               -- JSON list of level names, all present once complete
    tokens BLOB NOT NULL,               -- own tokens [token_start, token_end), uint32 LE
    nbytes INTEGER NOT NULL DEFAULT 0,  -- sum of its chunks, set when complete
    document_id INTEGER REFERENCES documents(id) ON DELETE CASCADE,
    chat_id INTEGER REFERENCES chats(id) ON DELETE CASCADE,
    complete INTEGER NOT NULL DEFAULT 0,
    writer_pid INTEGER,                 -- while incomplete: the process writing it
    last_used REAL NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX kv_entries_prefix ON kv_entries(model, prefix_hash);
CREATE INDEX kv_entries_parent ON kv_entries(parent_id);
CREATE INDEX kv_entries_document ON kv_entries(document_id);
CREATE INDEX kv_entries_chat ON kv_entries(chat_id);
CREATE INDEX kv_entries_lru ON kv_entries(complete, last_used);
CREATE TABLE kv_spans (
    entry_id INTEGER NOT NULL REFERENCES kv_entries(id) ON DELETE CASCADE,
    chunk_index INTEGER NOT NULL,
    token_start INTEGER NOT NULL,
    token_end INTEGER NOT NULL,
    prefix_hash BLOB NOT NULL,          -- of tokens[0:token_end]: the longest-prefix lookup key
    PRIMARY KEY (entry_id, chunk_index)
) WITHOUT ROWID;
CREATE INDEX kv_spans_prefix ON kv_spans(prefix_hash);
CREATE TABLE kv_chunks (
    id INTEGER PRIMARY KEY,             -- the rowid incremental blob I/O opens
    entry_id INTEGER NOT NULL,
    chunk_index INTEGER NOT NULL,
    level TEXT NOT NULL,
    nbytes INTEGER NOT NULL,
    checksum INTEGER NOT NULL,          -- CRC-32 of data
    data BLOB NOT NULL,
    UNIQUE (entry_id, chunk_index, level),
    FOREIGN KEY (entry_id, chunk_index) REFERENCES kv_spans(entry_id, chunk_index)
        ON DELETE CASCADE
);
CREATE TABLE settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL                 -- JSON
);
"""


def m001_initial(conn: sqlite3.Connection) -> None:
    execute_script(conn, M001_INITIAL)


M002_MESSAGE_TOKENS = """
CREATE TABLE message_tokens (
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    model TEXT NOT NULL REFERENCES models(fingerprint) ON DELETE CASCADE,
    tokens BLOB NOT NULL,               -- the message's exact tokens under that model, uint32 LE
    PRIMARY KEY (message_id, model)
) WITHOUT ROWID
"""


def m002_message_tokens(conn: sqlite3.Connection) -> None:
    """Message tokens move out of the stats JSON into a table keyed by model.

    Tokens stored before were not labelled with their model: they are given the model of the
    chat's newest KV entry (the one they were cached under), or the only model the store knows;
    with neither, they are dropped, and the chat is tokenized again from its text when used.
    """
    conn.execute(M002_MESSAGE_TOKENS)
    known = [row[0] for row in conn.execute("SELECT fingerprint FROM models")]
    rows = conn.execute(
        "SELECT id, chat_id, stats FROM messages WHERE stats LIKE '%\"tokens\"%'"
    ).fetchall()
    for message_id, chat_id, stats in rows:
        data = json.loads(stats)
        tokens = data.pop("tokens", None)
        newest = conn.execute(
            "SELECT model FROM kv_entries WHERE chat_id = ? ORDER BY created DESC LIMIT 1",
            (chat_id,),
        ).fetchone()
        model = newest[0] if newest else (known[0] if len(known) == 1 else None)
        if isinstance(tokens, list) and model is not None:
            conn.execute(
                "INSERT OR REPLACE INTO message_tokens VALUES (?, ?, ?)",
                (message_id, model, encode_tokens(tokens)),
            )
        conn.execute(
            "UPDATE messages SET stats = ? WHERE id = ?",
            (json.dumps(data) if data else None, message_id),
        )


M003_INTEGRITY = """
ALTER TABLE kv_chunks ADD COLUMN sha256 BLOB;  -- of data, checked on every read (NULL: from
                                               -- before m003, checked by its CRC only)
ALTER TABLE kv_chunks ADD COLUMN quarantined INTEGER NOT NULL DEFAULT 0;  -- failed a check:
                                               -- never read again, verify --repair fixes it
ALTER TABLE kv_entries ADD COLUMN writer_host TEXT;  -- while incomplete, with writer_pid
CREATE TABLE documents_new (
    id INTEGER PRIMARY KEY AUTOINCREMENT,      -- never reused: an id someone holds stays theirs
    content_hash TEXT NOT NULL UNIQUE,
    title TEXT NOT NULL,
    source_path TEXT,
    type TEXT NOT NULL,
    text TEXT NOT NULL,
    n_tokens INTEGER,
    created REAL NOT NULL
);
INSERT INTO documents_new SELECT * FROM documents;
DROP TABLE documents;
ALTER TABLE documents_new RENAME TO documents;
CREATE TABLE chats_new (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
INSERT INTO chats_new SELECT * FROM chats;
DROP TABLE chats;
ALTER TABLE chats_new RENAME TO chats;
CREATE TABLE document_tokens (
    document_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    model TEXT NOT NULL REFERENCES models(fingerprint) ON DELETE CASCADE,
    tokens INTEGER NOT NULL,            -- the document's own tokens under that model
    kept_tokens INTEGER NOT NULL,       -- how many fit its context (the rest was left out)
    PRIMARY KEY (document_id, model)
) WITHOUT ROWID
"""


def m003_integrity(conn: sqlite3.Connection) -> None:
    """Per-chunk SHA-256 and quarantine; the writer's host beside its pid; document and chat
    ids never reused (AUTOINCREMENT: the tables are rebuilt, foreign keys off meanwhile);
    each document's token counts per model."""
    execute_script(conn, M003_INTEGRITY)


M004_CALIBRATIONS = """
CREATE TABLE calibrations (
    id TEXT PRIMARY KEY,                -- SHA-256 (hex) of data: content-addressed, immutable
    model TEXT NOT NULL,                -- the model fingerprint it was made for
    data BLOB NOT NULL,                 -- opaque here (the codec's calibration bytes)
    meta TEXT NOT NULL,                 -- JSON summary for listings, or {}
    created REAL NOT NULL
);
CREATE INDEX calibrations_model ON calibrations(model, created);
ALTER TABLE kv_entries ADD COLUMN calibration TEXT;  -- the calibration its chunks need, or NULL
"""


def m004_calibrations(conn: sqlite3.Connection) -> None:
    """Per-model codec calibrations, and the one each KV entry's chunks were encoded with."""
    execute_script(conn, M004_CALIBRATIONS)


# 1: a part of the entry's window (KV held only for the last positions at its end: a sliding-window
# model's), not one of the chunks of its own tokens; never a prefix key. (No SQL comment: SQLite
# keeps a new column's text inside the table's CREATE statement.)
M005_WINDOWS = "ALTER TABLE kv_spans ADD COLUMN window_part INTEGER NOT NULL DEFAULT 0"


def m005_windows(conn: sqlite3.Connection) -> None:
    """Window parts: an entry may carry, beside the chunks of its own tokens, the KV of a
    cache section that holds only the last positions at its end (the sliding-window layers of
    an iSWA model), as chunks of its own at the entry's levels."""
    conn.execute(M005_WINDOWS)


def m006_chunk_seals(conn: sqlite3.Connection) -> None:
    """Every chunk sealed to its place (store.caches.blobs.seal_digest): a chunk moved to another
    entry, chunk or level, hashes and all, no longer passes its check.

    A row's SHA-256 of its bytes becomes its seal without reading the bytes; a row from before
    m003 (a CRC-32 only) is read once, sealed if its CRC passes and quarantined if not. The CRC
    column stays, since dropping it would rewrite every chunk of the store, but nothing reads it
    any more. Rows whose entry is gone (only a tool with foreign keys off leaves them) are never
    read, and stay as they are.
    """
    conn.create_function("kvdesk_seal", 4, blobs.seal_digest, deterministic=True)
    conn.execute(
        "UPDATE kv_chunks SET sha256 = kvdesk_seal((SELECT prefix_hash FROM kv_entries"
        " WHERE id = kv_chunks.entry_id), chunk_index, level, sha256)"
        " WHERE sha256 IS NOT NULL AND entry_id IN (SELECT id FROM kv_entries)")
    legacy = conn.execute(
        "SELECT c.id, c.checksum, e.prefix_hash, c.chunk_index, c.level FROM kv_chunks c"
        " JOIN kv_entries e ON e.id = c.entry_id WHERE c.sha256 IS NULL").fetchall()
    for rowid, crc, prefix_hash, chunk_index, level in legacy:
        with conn.blobopen("kv_chunks", "data", rowid, readonly=True) as blob:
            data = blob.read()
        if zlib.crc32(data) == crc:
            seal = blobs.seal_digest(prefix_hash, chunk_index, level, blobs.digest(data))
            conn.execute("UPDATE kv_chunks SET sha256 = ? WHERE id = ?", (seal, rowid))
        else:
            conn.execute("UPDATE kv_chunks SET quarantined = 1 WHERE id = ?", (rowid,))


# While a document's first attach is under way, or after one was killed before its cache was
# stored: the attaching process (pid and host, as kv_entries' writer_pid); NULL once attached.
M007_ATTACHING = ("ALTER TABLE documents ADD COLUMN attach_pid INTEGER",
                  "ALTER TABLE documents ADD COLUMN attach_host TEXT")


def m007_attaching(conn: sqlite3.Connection) -> None:
    """Unfinished documents: a document row is written before its prefill, so that a killed
    attach is known for what it is (`docs` says so; the next attach of the file or `gc`
    finishes or removes it), never passed off as a document with no cache."""
    for statement in M007_ATTACHING:
        conn.execute(statement)


# 1: the KV of one passage of a long document (its text after the shared system prompt, keyed
# by content like any prefix), not a document's prefix: a document's own entry is never one,
# and passage KV is stored at one level and computed when first retrieved.
M009_PASSAGE_KV = "ALTER TABLE kv_entries ADD COLUMN passage INTEGER NOT NULL DEFAULT 0"


def m009_passage_kv(conn: sqlite3.Connection) -> None:
    """Passage entries: a long document's passages each have a KV entry of their own, marked
    so that they are never taken for the document's prefix."""
    conn.execute(M009_PASSAGE_KV)


# The SHA-256 of the text whose KV a passage entry holds (store.documents.passages'
# `content_hash`), so that a document's passages with KV are counted by content, whichever
# document's question or pass stored them. Set when the entry is stored, or when one stored
# before this column is next found for its text.
M010_PASSAGE_HASH = (
    "ALTER TABLE kv_entries ADD COLUMN passage_hash TEXT",
    "CREATE INDEX kv_entries_passage_hash ON kv_entries(passage_hash)"
    " WHERE passage_hash IS NOT NULL")


def m010_passage_hash(conn: sqlite3.Connection) -> None:
    """Passage entries named by their text's hash: a document's cached passages counted."""
    for statement in M010_PASSAGE_HASH:
        conn.execute(statement)


# The entries of no document, chat or passage (the local API's prompt caches) and those
# extending them: stored before this version, one may hold KV that a restore had read back at
# a lossy level, stored again under every level's name (compact's error called `high`; a
# 6,091-token prompt answered nothing). Only caches: dropped, computed again when next asked.
M011_PROMPT_CACHES = """
WITH RECURSIVE doomed(id) AS (
    SELECT id FROM kv_entries
    WHERE document_id IS NULL AND chat_id IS NULL AND NOT passage
    UNION SELECT e.id FROM kv_entries e JOIN doomed d ON e.parent_id = d.id
)
SELECT id FROM doomed"""


def m011_prompt_caches(conn: sqlite3.Connection) -> str | None:
    """The API's prompt caches stored before lossy KV was kept from being stored again (and
    what extends them): each entry dropped is counted, whatever it extends (a document's or a
    chat's prefix among them)."""
    doomed = [(i,) for (i,) in conn.execute(M011_PROMPT_CACHES)]
    for table, column in (("kv_chunks", "entry_id"), ("kv_spans", "entry_id"),
                          ("kv_entries", "id")):
        conn.executemany(f"DELETE FROM {table} WHERE {column} = ?", doomed)
    n = len(doomed)
    return (f"{n} cached prompt{'s' if n != 1 else ''} of the local API (stored "
            "/v1/responses conversations' KV among them) made by an older kvdesk "
            f"{'were' if n != 1 else 'was'} dropped: each is computed again at its next "
            "use" if n else None)


# The documents whose KV an entry holds beyond its parent's (a chat's or a conversation's over
# several documents): deleting a document deletes them, whatever deletes it (the trigger); an
# entry naming a document deleted before it is written is refused in its write (`create_pending`).
M012_ENTRY_DOCUMENTS = (
    "CREATE TABLE kv_entry_documents (entry_id INTEGER NOT NULL REFERENCES kv_entries(id)"
    " ON DELETE CASCADE, document_id INTEGER NOT NULL REFERENCES documents(id)"
    " ON DELETE CASCADE, PRIMARY KEY (entry_id, document_id)) WITHOUT ROWID",
    "CREATE INDEX kv_entry_documents_document ON kv_entry_documents(document_id)",
    "CREATE TRIGGER documents_take_what_holds_them BEFORE DELETE ON documents BEGIN"
    " DELETE FROM kv_entries WHERE id IN (SELECT entry_id FROM kv_entry_documents"
    " WHERE document_id = OLD.id); END")


def _executing(statements: tuple[str, ...]) -> Callable[[sqlite3.Connection], None]:
    """A migration that runs `statements`."""
    def migration(conn: sqlite3.Connection) -> None:
        for statement in statements:
            conn.execute(statement)
    return migration


# Deleted documents' titles, per chat that was about one (its notes and exports name them).
M013_DELETED_TITLES = (
    "CREATE TABLE deleted_documents (chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE"
    " CASCADE, document_id INTEGER NOT NULL, title TEXT NOT NULL,"
    " PRIMARY KEY (chat_id, document_id)) WITHOUT ROWID",
    "CREATE TRIGGER documents_leave_their_titles BEFORE DELETE ON documents BEGIN INSERT OR"
    " REPLACE INTO deleted_documents SELECT chat_id, OLD.id, OLD.title FROM chat_documents"
    " WHERE document_id = OLD.id; END")


Migration = Callable[[sqlite3.Connection], str | None]
MIGRATIONS: list[tuple[str, Migration]] = [
    ("m001_initial", m001_initial),
    ("m002_message_tokens", m002_message_tokens),
    ("m003_integrity", m003_integrity),
    ("m004_calibrations", m004_calibrations),
    ("m005_windows", m005_windows),
    ("m006_chunk_seals", m006_chunk_seals),
    ("m007_attaching", m007_attaching),
    ("m008_passages", m008_passages),
    ("m009_passage_kv", m009_passage_kv),
    ("m010_passage_hash", m010_passage_hash),
    ("m011_prompt_caches", m011_prompt_caches),
    ("m012_entry_documents", _executing(M012_ENTRY_DOCUMENTS)),
    ("m013_deleted_titles", _executing(M013_DELETED_TITLES)),
    ("m014_cjk_index", m014_cjk_index),
]
SCHEMA_VERSION = len(MIGRATIONS)
# The migrations a store may lack while holding later ones, and that give it exactly the schema a
# straight upgrade gives when applied after them. m007 only adds two nullable columns to
# `documents`, which m008 and m009 neither read nor change; kvdesk 7599da0 and 9751386 (main,
# 2026-12-01) released m008 and m009 without it, and it came back before them.
APPLIED_LATE = frozenset({"m007_attaching"})


def schema_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]
