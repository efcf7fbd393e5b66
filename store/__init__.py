"""kvdesk's persistent store: documents, chats, messages, settings and compressed KV caches.

One data directory, one SQLite database (WAL) driven through sqlite-utils; KV chunks are stored as
BLOBs in it (the measured choice: see store.caches.blobs and benchmarks/RESULTS.md). `Store` is
the whole public API of the local store; the engine and the CLI wrap it thinly. An optional remote
tier (store.shared) shares document entries through S3-compatible object storage; the local
store stays the index and the cache. The store must never import llama.cpp, Qt, the codec or the
app: chunks are opaque bytes at named quality levels.

In rooms, each a subpackage whose `__init__` says what it owns and never imports, stacked top
down (pyproject.toml's layers contract states it): `shared` (the remote tier) and `backup` (a
consistent copy of the store, made while others use it), the `Store`
facade (`store.py`), `upgrade` (bringing a store's file to the schema) and `schema` (the
migrations of every room's tables), then side by side `caches` (KV entries and chunks, quota,
integrity, calibrations) and `documents` (models, documents, chats, messages, passages), then
`datadir` (connections, the disk reserve, locks between processes), and the leaf modules
`errors`, `records`, `tokens` and `words` (how the full-text index reads CJK text).
"""

from .caches.writers import BackgroundWriter, EntryWriter
from .documents.passages import text_hash
from .errors import (
    BackupError,
    BudgetFullError,
    CorruptChunkError,
    CorruptObjectError,
    DamagedError,
    DataDirGoneError,
    DiskFullError,
    IncompleteEntryError,
    NotFoundError,
    ReadOnlyError,
    RemoteError,
    SchemaVersionError,
    SharedObjectError,
    StoreError,
)
from .records import CalibrationRecord, Chat, Document, Entry, Message, Model, PrefixMatch, Span
from .shared.remote import RemoteConfig, RemoteTier
from .store import DEFAULT_CHUNK_SIZE, Store

__all__ = [
    "BackupError",
    "BudgetFullError",
    "DEFAULT_CHUNK_SIZE",
    "BackgroundWriter",
    "CalibrationRecord",
    "Chat",
    "CorruptChunkError",
    "CorruptObjectError",
    "Document",
    "Entry",
    "EntryWriter",
    "IncompleteEntryError",
    "Message",
    "Model",
    "NotFoundError",
    "PrefixMatch",
    "ReadOnlyError",
    "DamagedError",
    "DataDirGoneError",
    "DiskFullError",
    "RemoteConfig",
    "RemoteError",
    "RemoteTier",
    "SchemaVersionError",
    "SharedObjectError",
    "Span",
    "Store",
    "StoreError",
    "text_hash",
]
