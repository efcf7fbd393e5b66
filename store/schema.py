"""The store's schema: an ordered list of named migrations and the code that applies them.

Each migration runs in one IMMEDIATE transaction together with its row in `migrations` and the
new PRAGMA user_version, so a database is always exactly at a named version, and two processes
opening a fresh store at once apply each migration once. Never edit or reorder a released
migration; append a new one. A database at a version this code does not know is refused, never
"repaired".

Token ranges live in kv_spans (one row per chunk boundary of an entry, shared by all of its levels);
kv_chunks holds one row per (entry, chunk, level) with the bytes, so reading a chunk never loads
the rest of its entry.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from .errors import SchemaVersionError

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
    stats TEXT,                         -- JSON, e.g. tokens/s, or NULL
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
    for statement in M001_INITIAL.split(";"):
        if statement.strip():
            conn.execute(statement)


M_CALIBRATIONS = """
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


def m_calibrations(conn: sqlite3.Connection) -> None:
    """Per-model codec calibrations, and the one each KV entry's chunks were encoded with."""
    for statement in M_CALIBRATIONS.split(";"):
        if statement.strip():
            conn.execute(statement)


MIGRATIONS: list[tuple[str, Callable[[sqlite3.Connection], None]]] = [
    ("m001_initial", m001_initial),
    ("m_calibrations", m_calibrations),
]
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> list[str]:
    """Bring the database up to `target` (default: the latest); return the names applied."""
    applied = []
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = _check_known(conn)
            if version >= target:
                conn.execute("COMMIT")
                return applied
            name, apply = MIGRATIONS[version]
            conn.execute(
                "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied REAL)"
            )
            apply(conn)
            conn.execute("INSERT INTO migrations VALUES (?, ?)", (name, time.time()))
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(name)


def _check_known(conn: sqlite3.Connection) -> int:
    """The database's version, after checking its migration history is a prefix of ours."""
    version = schema_version(conn)
    known = [name for name, _ in MIGRATIONS]
    if version > len(known):
        raise SchemaVersionError(
            f"store schema version {version} is newer than this kvdesk understands "
            f"(up to {len(known)}); upgrade kvdesk or use another data directory"
        )
    has_history = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'migrations'"
    ).fetchone()
    history = (
        [row[0] for row in conn.execute("SELECT name FROM migrations ORDER BY rowid")]
        if has_history
        else []
    )
    if history != known[:version]:
        raise SchemaVersionError(
            f"store migration history {history} does not match this kvdesk's {known[:version]}"
        )
    if version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        raise SchemaVersionError("the database is not an empty file nor a kvdesk store")
    return version
